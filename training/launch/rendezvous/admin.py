"""Administer an etcd cluster as ``root``: turn authentication on, and give each job a user and role.

A job's user (``job-<id>``) has a password and a role that reads and writes ``/t5-failover/jobs/<id>/`` only;
the agents log in as it (:mod:`.client`). Who runs this: the local launcher and the tests (through
:class:`.members.LocalEtcd`), and on the clusters the step that submits a job, with the administrative
credentials the stack keeps (root's password file and a client certificate).

    python -m training.launch.rendezvous.admin add-job --job t5-123 --out DIR     # T5_ETCD_ADMIN_* set
    # DIR/job.env: the T5_ETCD_* variables the agents read; DIR/job-t5-123.password (0600)

A job id that has a user already is refused (exit 2): a new password would lock its running agents out at their
next login. ``--rotate`` replaces the user and its password on purpose (the job's agents then need the new
job.env).

Environment (``add-job``): T5_ETCD_ENDPOINTS, T5_ETCD_CA, T5_ETCD_CERT, T5_ETCD_KEY (as for the agents) and
T5_ETCD_ROOT_PASSWORD_FILE. Exit codes: 0 done, 2 bad settings, a job id that has a user (without ``--rotate``) or
etcd refused, 3 no member answered.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys

from training.launch.rendezvous.client import (
    ClientCredentials,
    EtcdClient,
    StoreRefused,
    StoreUnavailable,
    b64,
    prefix_end,
)

#: The key prefix under which jobs keep their state; a job's role covers ``JOBS_PREFIX + <job>/``.
JOBS_PREFIX = "/t5-failover/jobs/"


def job_user(job: str) -> str:
    return f"job-{job}"


class JobExists(ValueError):
    """The job already has an etcd user (its agents may be running with its password)."""


def _write_secret(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class EtcdAdmin:
    """``root``'s connection: ``creds`` name the endpoints, CA and client certificate; ``user`` is root."""

    def __init__(self, creds: ClientCredentials):
        self.creds = creds
        self.client = EtcdClient(creds)

    def enable_auth(self) -> None:
        """Create ``root`` with the password in ``creds.password_file`` and turn authentication on (once, on a
        new cluster: before this, anyone with a certificate could do it)."""
        with open(self.creds.password_file) as f:
            password = f.read().strip()
        self.client.post("auth/user/add", {"name": "root", "password": password}, authenticated=False)
        self.client.post("auth/user/grant", {"user": "root", "role": "root"}, authenticated=False)
        self.client.post("auth/enable", {}, authenticated=False)

    def add_job_user(self, job: str, directory: str, rotate: bool = False) -> ClientCredentials:
        """A user and role for ``job`` (read and write under its prefix only); its password is written 0600 in
        ``directory``. Returns the job's credentials. A job that has a user already raises :class:`JobExists`
        unless ``rotate``: then both are created again with a new password."""
        user, prefix = job_user(job), f"{JOBS_PREFIX}{job}/"
        if not rotate and self._user_exists(user):
            raise JobExists(
                f"job {job!r} has an etcd user already ({user}); a new password would lock its running "
                f"agents out: give a new job id, or pass --rotate to replace its password on purpose"
            )
        for path, body in (("auth/user/delete", {"name": user}), ("auth/role/delete", {"role": user})):
            try:
                self.client.post(path, body)
            except StoreRefused:
                pass  # did not exist
        self.client.post("auth/role/add", {"name": user})
        self.client.post(
            "auth/role/grant",
            {"name": user, "perm": {"permType": "READWRITE", "key": b64(prefix), "range_end": b64(prefix_end(prefix))}},
        )
        password = secrets.token_urlsafe(24)
        self.client.post("auth/user/add", {"name": user, "password": password})
        self.client.post("auth/user/grant", {"user": user, "role": user})
        os.makedirs(directory, mode=0o700, exist_ok=True)
        password_file = os.path.join(directory, f"{user}.password")
        _write_secret(password_file, password)
        return ClientCredentials(
            self.creds.endpoints, self.creds.ca, self.creds.cert, self.creds.key, user, password_file, prefix
        )

    def _user_exists(self, user: str) -> bool:
        try:
            self.client.post("auth/user/get", {"name": user})
            return True
        except StoreRefused as e:
            if "user name not found" in str(e):
                return False
            raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.launch.rendezvous.admin",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add-job", help="create the job's etcd user and role; write its credentials")
    add.add_argument("--job", required=True, help="the job's rendezvous id")
    add.add_argument("--out", required=True, help="directory for job.env and the password file (made 0700)")
    add.add_argument(
        "--rotate",
        action="store_true",
        help="replace the user of a job id that has one already, "
        "with a new password (without it such a job id is refused: its running agents would be "
        "locked out)",
    )
    a = p.parse_args(argv)
    env = dict(os.environ)
    root_pw = env.get("T5_ETCD_ROOT_PASSWORD_FILE", "")
    if not root_pw:
        print("error: T5_ETCD_ROOT_PASSWORD_FILE is not set: point it at root's password file", file=sys.stderr)
        return 2
    env.update({"T5_ETCD_USER": "root", "T5_ETCD_PASSWORD_FILE": root_pw, "T5_ETCD_PREFIX": JOBS_PREFIX})
    try:
        creds = EtcdAdmin(ClientCredentials.from_env(env)).add_job_user(a.job, a.out, rotate=a.rotate)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StoreRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StoreUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    _write_secret(os.path.join(a.out, "job.env"), "".join(f"{k}={v}\n" for k, v in creds.as_env().items()))
    print(f"etcd user {creds.user}: read/write {creds.prefix}; credentials in {os.path.join(a.out, 'job.env')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

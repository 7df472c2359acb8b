#!/usr/bin/env python3
"""TLS material of the ParallelCluster etcd members, made once and kept in Secrets Manager.

Runs on the members (Amazon Linux 2023's python3 + python3-cryptography), next to a copy of the project's
``training/launch/rendezvous/certs.py`` (the stack uploads both); standard library otherwise. Secrets Manager is
reached through the ``aws`` CLI, secrets are passed to it as ``file://`` (never on a command line).

    tls.py init    --region R --members-secret ARN --client-secret ARN --ips IP0,IP1,IP2
        member 0, first boot: when the members' secret is still the stack's placeholder ``{}``, make a CA, a
        certificate per member (its IP as subject alternative name), a client certificate (no common name), the
        ES256 key pair that signs etcd's auth tokens, and store them; then make sure the client secret holds the
        client material (a rerun after a crash completes it). Nothing changes when both are there.
    tls.py renew   (same arguments)
        rotation: new member and client certificates from the same CA and token keys (members and clients keep
        trusting each other through a rolling restart).
    tls.py install --region R --members-secret ARN --index I --dir DIR [--owner USER] [--wait-s S]
                   [--root-secret ARN]
        every member, every boot: wait until the members' secret holds the material, write this member's files
        into DIR (keys 0600, owned by USER when run as root); with ``--root-secret``, also root's client
        certificate (``client.crt``/``.key``, no common name) and password (``root.password``): the member's
        start-time repair logs in as root to rejoin a cluster after its data was lost
        (training/launch/rendezvous/member_repair.py).

Exit codes: 0 done, 1 AWS or timeout (one line naming it), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time


def _load_certs():
    """The project's certs module: the copy next to this file on a member, else the repository's (tests)."""
    copy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "certs.py")
    if os.path.exists(copy):
        import importlib.util

        spec = importlib.util.spec_from_file_location("t5_etcd_certs", copy)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from training.launch.rendezvous import certs as repository_copy

    return repository_copy


certs = _load_certs()

PLACEHOLDER = "{}"
MEMBER_FILES = {"ca.crt": "ca_cert", "jwt.pub": "jwt_pub", "jwt.key": "jwt_key"}


class Failure(Exception):
    """One line for the log; exit 1."""


def aws_secret(region: str, secret: str) -> dict:
    try:
        return json.loads(aws_secret_text(region, secret))
    except ValueError:
        raise Failure(f"secret {secret} is not JSON: reset it to {PLACEHOLDER} and run init again") from None


def aws_secret_text(region: str, secret: str) -> str:
    proc = subprocess.run(
        [
            "aws",
            "secretsmanager",
            "get-secret-value",
            "--region",
            region,
            "--secret-id",
            secret,
            "--query",
            "SecretString",
            "--output",
            "text",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise Failure(f"cannot read secret {secret}: {proc.stderr.strip()[-300:]}")
    return proc.stdout.rstrip("\n")


def put_secret(region: str, secret: str, value: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        os.chmod(f.name, 0o600)
        json.dump(value, f)
    try:
        proc = subprocess.run(
            [
                "aws",
                "secretsmanager",
                "put-secret-value",
                "--region",
                region,
                "--secret-id",
                secret,
                "--secret-string",
                f"file://{f.name}",
            ],
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise Failure(f"cannot write secret {secret}: {proc.stderr.strip()[-300:]}")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _issue_all(ca: "certs.CertificateAuthority", ips: list[str], directory: str) -> dict:
    members = {}
    for i, ip in enumerate(ips):
        paths = ca.issue(f"m{i}", directory, hosts=[ip])
        members[f"m{i}"] = {"ip": ip, "cert": _read(paths.cert), "key": _read(paths.key)}
    client = ca.issue("client", directory)  # no hosts: a client certificate without a common name
    return {"members": members, "client": {"cert": _read(client.cert), "key": _read(client.key)}}


def _client_value(material: dict) -> dict:
    return {
        "ca_cert": material["ca_cert"],
        "client_cert": material["client"]["cert"],
        "client_key": material["client"]["key"],
    }


def init(a: argparse.Namespace) -> str:
    material = aws_secret(a.region, a.members_secret)
    made = False
    if not material.get("ca_cert"):
        with tempfile.TemporaryDirectory() as tmp:
            ca = certs.CertificateAuthority.create(tmp, name="t5-failover ParallelCluster etcd CA")
            jwt_pub, jwt_key = (_read(p) for p in certs.jwt_key_pair(tmp))
            material = {
                "ca_cert": _read(ca.paths.cert),
                "ca_key": _read(ca.paths.key),
                "jwt_pub": jwt_pub,
                "jwt_key": jwt_key,
                **_issue_all(ca, a.ips, tmp),
            }
        put_secret(a.region, a.members_secret, material)
        made = True
    if not aws_secret(a.region, a.client_secret).get("client_cert"):
        put_secret(a.region, a.client_secret, _client_value(material))
    return "made a new CA and certificates" if made else "material already there: nothing made"


def renew(a: argparse.Namespace) -> str:
    material = aws_secret(a.region, a.members_secret)
    if not material.get("ca_key"):
        raise Failure(f"secret {a.members_secret} holds no CA yet: run init first")
    with tempfile.TemporaryDirectory() as tmp:
        ca_paths = certs.CertPaths(os.path.join(tmp, "ca.crt"), os.path.join(tmp, "ca.key"))
        for path, field in ((ca_paths.cert, "ca_cert"), (ca_paths.key, "ca_key")):
            with open(path, "w") as f:
                f.write(material[field])
        material.update(_issue_all(certs.CertificateAuthority(ca_paths), a.ips, tmp))
    put_secret(a.region, a.members_secret, material)
    put_secret(a.region, a.client_secret, _client_value(material))
    return "renewed the member and client certificates (same CA)"


def _write(path: str, text: str, mode: int, owner: str | None) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    if owner and os.geteuid() == 0:
        import pwd

        entry = pwd.getpwnam(owner)
        os.chown(tmp, entry.pw_uid, entry.pw_gid)
    os.replace(tmp, path)


def install(a: argparse.Namespace) -> str:
    deadline = time.monotonic() + a.wait_s
    while True:
        material = aws_secret(a.region, a.members_secret)
        if material.get("ca_cert"):
            break
        if time.monotonic() > deadline:
            raise Failure(
                f"secret {a.members_secret} still holds no TLS material after {a.wait_s:.0f} s: member 0 "
                f"makes it (journalctl -u t5-etcd-setup on member 0)"
            )
        time.sleep(a.poll_s)
    member = material["members"].get(f"m{a.index}")
    if member is None:
        raise Failure(f"secret {a.members_secret} has no certificate for member m{a.index}")
    os.makedirs(a.dir, mode=0o700, exist_ok=True)
    for name, field in MEMBER_FILES.items():
        _write(os.path.join(a.dir, name), material[field], 0o600, a.owner)
    _write(os.path.join(a.dir, "member.crt"), member["cert"], 0o600, a.owner)
    _write(os.path.join(a.dir, "member.key"), member["key"], 0o600, a.owner)
    if a.root_secret:
        _write(os.path.join(a.dir, "client.crt"), material["client"]["cert"], 0o600, a.owner)
        _write(os.path.join(a.dir, "client.key"), material["client"]["key"], 0o600, a.owner)
        _write(os.path.join(a.dir, "root.password"), aws_secret_text(a.region, a.root_secret), 0o600, a.owner)
    return f"member m{a.index} ({member['ip']}): TLS material in {a.dir}"


def _ips(text: str) -> list[str]:
    ips = text.split(",")
    for ip in ips:
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--ips {text!r}: {ip!r} is not an IPv4 address (e.g. 10.0.1.10,...)"
            ) from None
    if len(set(ips)) != len(ips) or len(ips) % 2 == 0:
        raise argparse.ArgumentTypeError(f"--ips {text!r}: give an odd number of distinct member addresses")
    return ips


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tls.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("init", "renew", "install"):
        s = sub.add_parser(name)
        s.add_argument("--region", required=True)
        s.add_argument("--members-secret", required=True)
        if name == "install":
            s.add_argument("--index", type=int, required=True)
            s.add_argument("--dir", required=True)
            s.add_argument("--owner")
            s.add_argument("--wait-s", type=float, default=1800.0)
            s.add_argument("--poll-s", type=float, default=10.0)
            s.add_argument("--root-secret", help="root's password secret: write root's credentials too")
        else:
            s.add_argument("--client-secret", required=True)
            s.add_argument("--ips", type=_ips, required=True)
    a = p.parse_args(argv)
    try:
        print(f"[etcd tls] {globals()[a.command](a)}")
    except Failure as e:
        print(f"[etcd tls] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

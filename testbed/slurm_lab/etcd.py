"""The Slurm lab's membership store: a 3-member etcd on the lab's host side, outside every compute node's namespace.

The clusters run their members on hosts that are not compute nodes (ParallelCluster: the stack's etcd hosts);
the lab mirrors that with three addresses on its host-side bridge (netns mode) or three loopback ports
(loopback mode, where the compute nodes share the host's network anyway). The members are the project's
:class:`training.launch.rendezvous.members.LocalEtcd` (TLS with client certificates, auth on, root administers):
this script starts them detached, records what it needs to stop, kill and restart them in
``<root>/etcd/state.json``, and writes ``<root>/etcd/admin.env``: root's ``T5_ETCD_*`` variables, with which a
batch script makes its job's etcd user (``python -m training.launch.rendezvous.admin add-job``).

    etcd.py start --root R --hosts 10.77.1.2,10.77.1.3,10.77.1.4     (up.sh)
    etcd.py pids --root R | leader | health [--timeout S]       leader: once one leads (--timeout, default 30 s)
    etcd.py kill --root R MEMBER|leader                             SIGKILL (fault.sh store kill-leader): the
                                                                    leader's kill prints who leads next, how soon
    etcd.py stop --root R MEMBER|all                                SIGTERM, wait (fault.sh store stop)
    etcd.py restart --root R MEMBER|all                             start again with its data (fault.sh store start)

Every member runs with ``SLAB_STORE_TAG`` in its environment (from up.sh), so down.sh finds it without a PID file.
Exit 0 done, 1 failed (one line says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from training.launch.config import LaunchError
from training.launch.rendezvous.admin import JOBS_PREFIX
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused, StoreUnavailable
from training.launch.rendezvous.members import LocalEtcd, etcd_binary

#: Runs each member: the real binary, minus the peer-address check that co-located members fail (see the script).
MEMBER = Path(__file__).with_name("etcd-member.sh")


def _dir(root: str) -> Path:
    return Path(root) / "etcd"


def _state(root: str) -> dict:
    path = _dir(root) / "state.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise SystemExit(f"etcd.py: no lab etcd at {path} (scripts/slurm_lab.sh up starts it)") from None


def _save(root: str, state: dict) -> None:
    tmp = _dir(root) / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(_dir(root) / "state.json")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _root_creds(state: dict) -> ClientCredentials:
    a = state["admin"]
    return ClientCredentials(
        tuple(m["client_url"] for m in state["members"]),
        a["T5_ETCD_CA"],
        a["T5_ETCD_CERT"],
        a["T5_ETCD_KEY"],
        "root",
        a["T5_ETCD_ROOT_PASSWORD_FILE"],
        JOBS_PREFIX,
    )


def start(root: str, hosts: list[str]) -> int:
    work = _dir(root)
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o700)
    os.environ["SLAB_ETCD_REAL_BIN"] = etcd_binary()  # inherited by the members, restarts included
    os.environ["T5_ETCD_BIN"] = str(MEMBER)
    etcd = LocalEtcd.start(str(work), size=len(hosts), hosts=hosts, die_with_parent=False)
    creds = etcd.root_credentials()
    admin = {
        "T5_ETCD_ENDPOINTS": ",".join(creds.endpoints),
        "T5_ETCD_CA": creds.ca,
        "T5_ETCD_CERT": creds.cert,
        "T5_ETCD_KEY": creds.key,
        "T5_ETCD_ROOT_PASSWORD_FILE": creds.password_file,
    }
    _save(
        root,
        {
            "admin": admin,
            "log": str(work / "etcd.log"),
            "real_bin": os.environ["SLAB_ETCD_REAL_BIN"],
            "members": [
                {"name": m.name, "client_url": m.client_url, "pid": m.process.pid, "argv": m.argv} for m in etcd.members
            ],
        },
    )
    fd = os.open(work / "admin.env", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in admin.items()))
    etcd.log.close()  # the members keep their own handles; nothing here outlives this process
    print(" ".join(f"{m.name}={m.client_url}(pid {m.process.pid})" for m in etcd.members))
    return 0


def _members(state: dict, which: str) -> list[dict]:
    if which == "all":
        return state["members"]
    if which == "leader":
        return [_leader(state)]
    found = [m for m in state["members"] if m["name"] == which]
    if not found:
        raise SystemExit(
            f"etcd.py: no member {which!r}; use one of {', '.join(m['name'] for m in state['members'])}, leader or all"
        )
    return found


def _status(state: dict, member: dict) -> dict | None:
    client = EtcdClient(replace(_root_creds(state), endpoints=(member["client_url"],)), request_timeout_s=2.0)
    try:
        return client.post("maintenance/status", {}, authenticated=False)
    except (StoreUnavailable, StoreRefused):
        return None


def _leader(state: dict) -> dict:
    for m in state["members"]:
        s = _status(state, m)
        if s and s.get("leader") == s.get("header", {}).get("member_id"):
            return m
    raise SystemExit("etcd.py: no member leads now (stopped, or electing)")


def wait_leader(root: str, timeout_s: float) -> dict:
    """The member that leads, once one does (an election after the leader's loss takes about a second)."""
    state, deadline = _state(root), time.monotonic() + timeout_s
    while True:
        try:
            return _leader(state)
        except SystemExit:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def signal_members(root: str, which: str, sig: int) -> int:
    state = _state(root)
    hit = _members(state, which)
    t0 = time.monotonic()
    for m in hit:
        if _alive(m["pid"]):
            os.kill(m["pid"], sig)
    deadline = time.monotonic() + 15
    while any(_alive(m["pid"]) for m in hit):
        if time.monotonic() > deadline:
            for m in hit:
                if _alive(m["pid"]):
                    os.kill(m["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.05)
    if which == "leader":  # the others elect a new one: who, and how long it took (the store noticed)
        new = wait_leader(root, 10.0)
        print(f"{hit[0]['name']} -> {new['name']} in {time.monotonic() - t0:.2f} s")
        return 0
    print(" ".join(m["name"] for m in hit))
    return 0


def restart(root: str, which: str) -> int:
    state = _state(root)
    with open(state["log"], "ab") as log:
        for m in _members(state, which):
            if _alive(m["pid"]):
                continue
            # its data directory holds the cluster: it rejoins as a member of the existing cluster
            m["argv"] = [a if a != "new" else "existing" for a in m["argv"]]
            m["pid"] = subprocess.Popen(
                m["argv"],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "SLAB_ETCD_REAL_BIN": state["real_bin"]},
            ).pid
    _save(root, state)
    print(" ".join(f"{m['name']}(pid {m['pid']})" for m in state["members"]))
    return 0


def health(root: str, timeout_s: float) -> int:
    """Until every member answers and they agree on a leader."""
    state = _state(root)
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = [_status(state, m) for m in state["members"]]
        leaders = {s.get("leader") for s in statuses if s}
        if all(statuses) and len(leaders) == 1 and "0" not in leaders:
            print(f"healthy: {len(statuses)} members, leader {_leader(state)['name']}")
            return 0
        if time.monotonic() > deadline:
            down = [m["name"] for m, s in zip(state["members"], statuses) if not s]
            print(
                f"etcd.py: not healthy after {timeout_s:g} s (not answering: {', '.join(down) or '-'}); see "
                f"{state['log']}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="testbed/slurm_lab/etcd.py", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("start", "pids", "leader", "health", "kill", "stop", "restart"))
    p.add_argument("member", nargs="?", default="all", help="m0, m1, m2, leader or all")
    p.add_argument("--root", required=True, help="the lab's root (SLAB_ROOT)")
    p.add_argument("--hosts", help="start: comma-separated member addresses")
    p.add_argument("--timeout", type=float, default=30.0, help="health, leader: seconds to wait")
    a = p.parse_args(argv)
    try:
        if a.command == "start":
            hosts = [h for h in (a.hosts or "").split(",") if h]
            if len(hosts) not in (1, 3, 5):
                p.error(f"--hosts {a.hosts!r}: give 3 member addresses (or 1 or 5)")
            return start(a.root, hosts)
        if a.command == "pids":
            print(" ".join(str(m["pid"]) for m in _state(a.root)["members"] if _alive(m["pid"])))
            return 0
        if a.command == "leader":
            print(wait_leader(a.root, a.timeout)["name"])
            return 0
        if a.command == "health":
            return health(a.root, a.timeout)
        if a.command == "kill":
            return signal_members(a.root, a.member, signal.SIGKILL)
        if a.command == "stop":
            return signal_members(a.root, a.member, signal.SIGTERM)
        return restart(a.root, a.member)
    except LaunchError as e:
        print(f"etcd.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""A member that lost its data rejoins by itself: decided at the member's own start, before etcd runs.

etcd starts a member with an empty data directory as one of a *new* cluster (``--initial-cluster-state=new``),
which the members that kept the cluster refuse (the lost member's entry has another raft log; a fresh one would
fork the cluster). A replaced node, a new volume or a wiped disk would need hands: ``member remove`` of the old
entry, ``member add`` of the same peer URL, and a start with ``--initial-cluster-state=existing``. This module
does it, the same on the EKS members, the ParallelCluster members and the local cluster (:mod:`.members`):

* **data present** (``member/wal`` in the data directory): start as given (etcd ignores the initial-cluster
  flags once it has a log; the member rejoins as itself);
* **no data, no other member answers**: the first start of all members: start ``new`` as given;
* **no data, the others answer** (a member serves clients only once its cluster has a quorum): remove this
  member's old entry (found by name or peer URL), add it again with its peer URL, start ``existing`` with the
  membership the add returned. An entry that was added and never started (an earlier run crashed between the add
  and etcd's first log write; or the first start of a member the others formed the cluster without) carries no
  name and this member's peer URL: reused as it is, not removed. Every step is safe to rerun after a crash.

Membership calls go through the etcd v3 JSON gateway (``cluster/member/list|remove|add``) with the project's
client (:mod:`.client`), as ``root`` where authentication is on (etcd allows membership changes to root only):
the administrative credentials the stack's bootstrap uses. Listing needs no login (a member that starts before
root's password exists, on a cluster whose authentication is not on yet, still finds out).

    python -m training.launch.rendezvous.member_repair --name m1 --peer-url https://10.0.0.2:2380 \\
        --data-dir /var/lib/etcd --endpoints https://10.0.0.1:2379,https://10.0.0.3:2379 \\
        --ca ca.crt --cert client.crt --key client.key [--password-file root.password] -- etcd --name m1 ...

replaces itself with the etcd command after ``--``, its initial-cluster flags set as decided. Exit codes: 2 bad
arguments, 3 the others answered but the membership change failed (the supervisor starts it again: systemd,
the kubelet); otherwise etcd's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass

from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused, StoreUnavailable

#: The flags this module decides (both spellings, ``--flag value`` and ``--flag=value``, are replaced).
STATE_FLAG, CLUSTER_FLAG = "--initial-cluster-state", "--initial-cluster"

#: Seconds each call waits for a member: connect, then its answer. A member of a cluster still forming accepts
#: the connection but answers nothing until its cluster has a quorum: the read timeout is what a first start pays
#: per other member before it starts ``new``.
CALL_TIMEOUT_S = (1.0, 2.0)


@dataclass(frozen=True)
class MemberIdentity:
    """Who this member is.

    Attributes:
        name: its etcd name (``--name``): ``m1``, ``etcd-1``.
        peer_url: the URL the other members reach it at (``--initial-advertise-peer-urls``, one URL).
        data_dir: its data directory (``--data-dir``).
    """

    name: str
    peer_url: str
    data_dir: str


@dataclass(frozen=True)
class StartPlan:
    """How etcd starts.

    Attributes:
        state: ``--initial-cluster-state`` to start with; None: as given (the member has its data).
        initial_cluster: ``--initial-cluster`` to start with (``name=peer_url,...``); None: as given.
        action: one line for the member's log: what was found and done.
    """

    state: str | None
    initial_cluster: str | None
    action: str


def has_data(data_dir: str) -> bool:
    """Whether etcd finds a raft log in ``data_dir`` (it then restarts from it, whatever the flags say)."""
    return os.path.isdir(os.path.join(data_dir, "member", "wal"))


#: What a member answers to a membership change it cannot make *yet*: etcd's strict reconfiguration check refuses
#: an add until every voting member has been connected for 5 s (a cluster just started, a member just joined) and
#: while too few members run; an add whose answer was lost finds its URL added (the next list shows the entry,
#: reused). Tried again until ``wait_s``; any other refusal ends the start.
NOT_YET = ("unhealthy cluster", "not enough started members", "peerurl exists")


def plan_start(me: MemberIdentity, client: EtcdClient, authenticated: bool, wait_s: float = 60.0) -> StartPlan:
    """Decide, and make the membership change, for ``me`` (see the module docstring). ``client`` reaches the
    other members; ``authenticated``: log in (as ``client``'s user, root) for the changes; ``wait_s``: how long
    changes the members cannot make yet (:data:`NOT_YET`, no member answering) are tried again before the
    :class:`StoreRefused` / :class:`StoreUnavailable` propagates (the start fails; its supervisor retries)."""
    if has_data(me.data_dir):
        return StartPlan(None, None, f"data in {me.data_dir}: starts as itself")
    try:
        client.post("cluster/member/list", {}, authenticated=False)
    except StoreUnavailable:
        return StartPlan("new", None, "no data and no other member answers: first start of the cluster, as new")
    deadline, removed = time.monotonic() + wait_s, []
    while True:
        try:
            members, action = _rejoin(me, client, authenticated, removed)
            break
        except (StoreRefused, StoreUnavailable) as e:
            retry = isinstance(e, StoreUnavailable) or any(words in str(e).lower() for words in NOT_YET)
            if not retry or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    _set_aside_partial(me.data_dir)
    return StartPlan("existing", initial_cluster(me, members), action)


def _rejoin(me: MemberIdentity, client: EtcdClient, authenticated: bool, removed: list[str]) -> tuple[list[dict], str]:
    """One try: the cluster's members with ``me`` among them as an entry never started, and what was done
    (``removed``: the entries this start removed, over its tries)."""
    members = client.post("cluster/member/list", {}, authenticated=False).get("members", [])
    mine = [m for m in members if m.get("name") == me.name or me.peer_url in m.get("peerURLs", [])]
    if len(mine) == 1 and not mine[0].get("name") and mine[0].get("peerURLs") == [me.peer_url]:
        return members, f"no data; its entry {mine[0]['ID']} was added and never started: joins as it"
    for old in mine:
        try:
            client.post("cluster/member/remove", {"ID": old["ID"]}, authenticated=authenticated)
        except StoreRefused as e:
            if "member not found" not in str(e):  # removed by an earlier try whose answer was lost: done
                raise
        removed.append(old["ID"])
    added = client.post("cluster/member/add", {"peerURLs": [me.peer_url]}, authenticated=authenticated)
    gone = ", ".join(removed) or "none"
    return added.get("members", []), (
        f"no data; removed its old entry ({gone}), added {added['member']['ID']} at {me.peer_url}: rejoins"
    )


def initial_cluster(me: MemberIdentity, members: list[dict]) -> str:
    """``--initial-cluster`` for joining ``members`` (etcd matches it against the cluster by peer URL). An entry
    never started has no name yet: this member's is its own; another's gets a placeholder (etcd checks URLs)."""
    pairs = []
    for m in members:
        urls = m.get("peerURLs", [])
        name = m.get("name") or (me.name if me.peer_url in urls else f"unstarted-{m['ID']}")
        pairs += [f"{name}={url}" for url in urls]
    return ",".join(pairs)


def _set_aside_partial(data_dir: str) -> None:
    """A ``member`` directory without a log (a start that crashed before etcd's first write) is moved aside: a
    joining member must begin empty, and nothing in it is the cluster's."""
    partial = os.path.join(data_dir, "member")
    if os.path.isdir(partial):
        shutil.move(partial, f"{partial}.partial-{int(time.time())}")


def with_plan(argv: list[str], plan: StartPlan) -> list[str]:
    """``argv`` (an etcd command) with the plan's initial-cluster flags in place of those it has."""
    if plan.state is None:
        return list(argv)
    decided = {STATE_FLAG: plan.state, CLUSTER_FLAG: plan.initial_cluster}
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in decided and decided[flag] is not None:
            skip = "=" not in arg  # "--flag value": drop the value too
            continue
        out.append(arg)
    return out + [f"{flag}={value}" for flag, value in decided.items() if value is not None]


def _decide(a: argparse.Namespace) -> StartPlan:
    """The plan for the parsed arguments ``a`` (the client built from them)."""
    me = MemberIdentity(a.name, a.peer_url, a.data_dir)
    if has_data(me.data_dir):
        return StartPlan(None, None, f"data in {me.data_dir}: starts as itself")
    missing = next((path for path in (a.ca, a.cert, a.key) if not os.path.isfile(path)), None)
    if missing:  # EKS: the bootstrap makes root's credentials once the members run: until then, the first start
        return StartPlan(None, None, f"no data, no administrative credentials yet ({missing}): starts as given")
    password = a.password_file if a.password_file and os.path.isfile(a.password_file) else ""
    endpoints = tuple(e.strip() for e in a.endpoints.split(",") if e.strip())
    # without root's password no call logs in, and the password file is never read: any readable file will do
    creds = ClientCredentials(endpoints, a.ca, a.cert, a.key, "root", password or a.ca, "/")
    client = EtcdClient(creds, request_timeout_s=CALL_TIMEOUT_S)
    return plan_start(me, client, authenticated=bool(password), wait_s=a.wait_s)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: give the etcd command after --", file=sys.stderr)
        return 2
    own, etcd = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    p = argparse.ArgumentParser(prog="python -m training.launch.rendezvous.member_repair", description=__doc__)
    p.add_argument("--name", required=True, help="this member's etcd name")
    p.add_argument("--peer-url", required=True, help="its peer URL (the one the others reach it at)")
    p.add_argument("--data-dir", required=True, help="its data directory")
    p.add_argument("--endpoints", required=True, help="the other members' client URLs, comma separated")
    p.add_argument("--ca", required=True, help="the members' CA certificate")
    p.add_argument(
        "--cert", required=True, help="root's client certificate (no common name: etcd refuses one on the gateway)"
    )
    p.add_argument("--key", required=True, help="its key")
    p.add_argument("--wait-s", type=float, default=60.0, help="how long to retry a change the members cannot make yet")
    p.add_argument(
        "--password-file", default="", help="root's password; absent or missing: no login (authentication not on)"
    )
    a = p.parse_args(own)
    if not etcd:
        p.error("give the etcd command after --")
    try:
        plan = _decide(a)
    except ValueError as e:
        print(f"[etcd member {a.name}] error: {e}", file=sys.stderr)
        return 2
    except (StoreRefused, StoreUnavailable) as e:
        print(f"[etcd member {a.name}] no data, and rejoining the running members failed: {e}", file=sys.stderr)
        return 3
    print(f"[etcd member {a.name}] {plan.action}", flush=True)
    command = with_plan(etcd, plan)
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

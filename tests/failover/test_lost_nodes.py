"""A node of the running round that stops its rendezvous keep-alives (dead, or cut off with its sockets open) is
found by the other agents within the keep-alive limit, and their workers are SIGKILLed rather than SIGTERMed
(a worker blocked in a collective with the lost node never runs its signal handler)
(training/launch/lost_nodes.py). Real c10d handlers in the probe; real agents and a real store end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.failover.rdzv_probe import run_probe
from tests.failover.test_store_security import start_store
from training.launch.config import RDZV_ENV

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("lost_node_probe.py")

# A worker that records its start and any SIGTERM (one JSON line each: pid, world size, restart count). "stuck":
# it goes on waiting after SIGTERM, as one blocked in a collective with a lost peer; "obedient": it exits.
WORKER = """
import json, os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
def note(what):
    with open(out, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, "world": int(os.environ["WORLD_SIZE"]),
                            "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"])}) + "\\n")
def on_term(*_):
    note("SIGTERM")
    if mode == "obedient":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
note("start")
while True:
    time.sleep(0.1)
"""


def probe(*args: str) -> dict:
    return run_probe(PROBE, *args)


def test_a_member_whose_keep_alives_stop_is_found_within_the_limit_and_a_rejoin_is_not():
    r = probe("fixed")
    assert r["steady_max_waiting"] == 0, r  # heartbeating members: never a restart
    assert r["rejoin_seen_s"] is not None and r["lost_on_rejoin"] == [], r  # a re-join is a wait, not a loss
    assert r["lost"] == [r["second_node"]], r
    assert r["lost_after_s"] is not None and r["lost_after_s"] < 8, r
    assert r["rejoin_round"] == 2, r  # a node waiting to join is waited for, never left out of the next round
    # knowing the other member is lost, the next round forms at once instead of after the 3 s last call
    assert r["reform_round"] == 1 and r["reform_s"] < 1.5, r


def test_without_the_patch_torch_never_restarts_the_round_for_a_dead_member():
    """The reason for the patch: torch drops the dead node only at the next rendezvous, which nothing starts,
    and that rendezvous then waits out its last call for a node it could know is gone."""
    r = probe()
    assert r["steady_max_waiting"] == 0 and r["lost_after_s"] is None, r
    assert r["rejoin_round"] == 2 and r["reform_round"] == 1 and r["reform_s"] >= 2.9, r  # the full last call


def test_round_watch_declares_only_members_dropped_after_the_keep_alive_limit():
    """torch's own state object: a member gone with a stale keep-alive is lost; one that just left to re-join
    (fresh keep-alive a moment ago), one still beating, and any member of a closed (finished) job are not."""
    from datetime import datetime, timedelta, timezone

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    from training.launch.lost_nodes import RoundWatch, describe

    t0 = datetime(2026, 11, 24, tzinfo=timezone.utc)
    a, b, c = (_NodeDesc("host-a", 11, 0), _NodeDesc("host-b", 22, 0), _NodeDesc("host-c", 33, 0))
    state = _RendezvousState()
    state.complete = True
    state.participants = {a: 0, b: 1, c: 2}
    state.last_heartbeats = {a: t0, b: t0, c: t0}
    watch = RoundWatch.of(state, expiry=timedelta(seconds=3), now=t0)
    later = t0 + timedelta(seconds=2)
    state.last_heartbeats = {a: later, c: later}  # b keeps beating until 2 s, then...
    state.last_heartbeats[b] = t0 + timedelta(seconds=2)
    assert watch.lost(state, now=later) == []
    del state.participants[b], state.last_heartbeats[b]  # ...leaves the round to re-join (a restart)
    assert watch.lost(state, now=t0 + timedelta(seconds=2.5)) == []  # its last keep-alive is 0.5 s old
    state.wait_list.add(b)  # ...and waits for the next round, beating again
    state.last_heartbeats[b] = t0 + timedelta(seconds=2.6)
    del state.participants[c], state.last_heartbeats[c]  # c was dropped as dead: last keep-alive at 2 s
    assert [(n, round(age, 1)) for n, age in watch.lost(state, now=t0 + timedelta(seconds=5.5))] == [(c, 3.5)]
    state.closed = True  # the job finished: agents stop their keep-alives on the way out
    assert watch.lost(state, now=t0 + timedelta(seconds=60)) == []
    assert describe(c) == "host-c (agent pid 33)"


def test_the_next_round_closes_early_only_when_every_live_member_and_waiting_node_is_in():
    from datetime import datetime, timedelta, timezone

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    from training.launch.lost_nodes import RoundWatch

    t0 = datetime(2026, 11, 24, tzinfo=timezone.utc)
    a, b, c, new = (_NodeDesc(f"host-{x}", i, 0) for i, x in enumerate("abcn"))
    old = _RendezvousState()
    old.participants, old.last_heartbeats = {a: 0, b: 1, c: 2}, {a: t0, b: t0, c: t0}
    watch = RoundWatch.of(old, expiry=timedelta(seconds=3), now=t0)
    nxt = _RendezvousState()  # a's view of the next round, 4 s later: c sent nothing since t0 (dropped as dead)
    now = t0 + timedelta(seconds=4)
    nxt.round, nxt.participants, nxt.deadline = 1, {a: 0}, now + timedelta(seconds=3)
    nxt.last_heartbeats = {a: now, b: now}
    nxt.wait_list = {b}  # b re-joins: not in yet
    assert not watch.everyone_in(nxt, a, min_nodes=1, now=now)
    nxt.wait_list, nxt.participants = set(), {a: 0, b: 0}
    assert watch.everyone_in(nxt, a, min_nodes=1, now=now)  # c is lost: nobody else to wait for
    assert not watch.everyone_in(nxt, a, min_nodes=3, now=now)  # below MIN: torch keeps waiting
    nxt.wait_list = {new}  # a node that was never a member waits for a place: it is waited for
    assert not watch.everyone_in(nxt, a, min_nodes=1, now=now)
    nxt.wait_list, nxt.redundancy_list = set(), {new}  # a hot spare: it takes the free place, so wait for it
    assert not watch.everyone_in(nxt, a, min_nodes=1, now=now)
    nxt.redundancy_list = set()
    fresh = t0 + timedelta(seconds=3.9)  # c beat 0.1 s ago and is between leaving and re-joining: wait
    assert not RoundWatch({a: t0, b: t0, c: fresh}, timedelta(seconds=3)).everyone_in(nxt, a, min_nodes=1, now=now)
    nxt.complete = True  # nothing to close
    assert not watch.everyone_in(nxt, a, min_nodes=1, now=now)


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _wait(pred, what: str, timeout: float = 90):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


class Agents:
    """Real agents (one worker each, keep-alive 1 s x 3) on a standalone store in ``tmp``; ``stop()`` ends all."""

    def __init__(self, tmp: Path, nnodes: str, mode: str):
        self.tmp, self.nnodes, self.mode = tmp, nnodes, mode
        self.store, port = start_store(tmp, "127.0.0.1")
        self.endpoint = f"127.0.0.1:{port}"
        self.script = tmp / "worker.py"
        self.script.write_text(WORKER)
        self.log = tmp / "workers.jsonl"
        self.procs: list[subprocess.Popen] = []
        self.errs: list[Path] = []

    def start(self) -> subprocess.Popen:
        err = self.tmp / f"agent{len(self.procs)}.err"
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "training.launch.agent", "--nnodes", self.nnodes, "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint, "--rdzv-id", "lost-node-test",
             "--rdzv-conf", "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120,"
             "last_call_timeout=1", "--max-restarts", "0", "--monitor-interval", "0.1", str(self.script),
             str(self.log), self.mode],
            cwd=ROOT, env={**os.environ, **RDZV_ENV}, stdout=subprocess.DEVNULL, stderr=err.open("w"),
            start_new_session=True))
        self.errs.append(err)
        return self.procs[-1]

    def starts(self) -> list[dict]:
        return [r for r in _records(self.log) if r["what"] == "start"]

    def stderr(self) -> str:
        return "".join(e.read_text() for e in self.errs)

    def stop(self) -> None:
        for a in self.procs:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(a.pid, sig)
                except ProcessLookupError:
                    pass
        for r in _records(self.log):
            try:
                os.kill(r["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.store.kill()


@pytest.fixture
def two_agents(tmp_path):
    """Two agents of a 2-node job with stuck workers; yields (agents, worker log, stderr paths) once both
    workers run in one round."""
    agents = Agents(tmp_path, "2", "stuck")
    try:
        agents.start(), agents.start()
        _wait(lambda: len(agents.starts()) == 2, "both workers")
        yield agents.procs, agents.log, agents.errs
    finally:
        agents.stop()


@pytest.mark.e2e
def test_a_silent_node_ends_the_survivors_workers_at_once_by_sigkill(two_agents):
    agents, log, errs = two_agents
    first = {r["pid"]: r for r in _records(log)}
    assert all(r["world"] == 2 for r in first.values())
    victim = agents[1]
    survivor_worker = next(pid for pid in first if pid in _children_of(agents[0].pid))
    os.killpg(victim.pid, signal.SIGSTOP)  # the node goes silent: agent and worker stopped, sockets open
    lines = _wait(lambda: [ln for ln in errs[0].read_text().splitlines() if "[agent] lost node(s)" in ln],
                  "the survivor's lost-node line", timeout=30)
    assert f"agent pid {victim.pid}" in lines[0], lines
    _wait(lambda: not _alive(survivor_worker), "the survivor's worker to end", timeout=10)
    mine = [r for r in _records(log) if r["pid"] == survivor_worker]
    assert [r["what"] for r in mine] == ["start"], mine  # never SIGTERMed: killed outright
    assert agents[0].poll() is None  # the agent lives on: back in the rendezvous, waiting for a second node


@pytest.mark.e2e
def test_without_a_fault_no_node_is_declared_lost(two_agents):
    agents, log, errs = two_agents
    time.sleep(8)  # over twice the keep-alive limit
    assert "lost node" not in errs[0].read_text() + errs[1].read_text()
    assert all(_alive(r["pid"]) for r in _records(log)) and all(a.poll() is None for a in agents)


def _children_of(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.mark.e2e
def test_a_joining_node_restarts_the_round_through_torchs_sigterm_stop_and_is_no_loss(tmp_path):
    """The other membership change: a node joins a 1:2 job. The running agent stops its worker the usual way
    (SIGTERM, so a training worker checkpoints the step) and nobody is declared lost."""
    agents = Agents(tmp_path, "1:2", "obedient")
    try:
        agents.start()
        first = _wait(lambda: agents.starts(), "the first worker")[0]
        assert first["world"] == 1
        agents.start()
        _wait(lambda: [r for r in agents.starts() if r["world"] == 2], "a round of two")
        mine = [r["what"] for r in _records(agents.log) if r["pid"] == first["pid"]]
        assert mine == ["start", "SIGTERM"], mine
        assert "lost node" not in agents.stderr() and all(a.poll() is None for a in agents.procs), agents.stderr()
    finally:
        agents.stop()

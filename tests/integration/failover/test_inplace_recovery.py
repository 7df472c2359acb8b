"""In-process recovery's survivor-side primitive (training/job/inplace, docs/inprocess.md) with real processes on
gloo and the real local 3-member etcd: three ranks all-reduce in a loop, one is SIGKILLed, the two survivors keep
their processes (PIDs compared), re-form at world 2 and go on with correct sums; a fresh process then joins and the
three go on at world 3 from the survivors' state; work left blocked on the first group ends once the survivors cut
what it held open. And the fall-backs: a re-formation that cannot be agreed within
its bound, or whose group cannot form (a member lost after the decision), says so in one line and raises
InPlaceFailed (the caller's full restart). The agreement's rules alone are
tests/unit/failover/test_inplace_agreement.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from training.job.agent_notes import request_cut
from training.job.inplace.agreement import AgreementSettings, InPlaceFailed, Membership
from training.job.inplace.group import GroupSettings, InPlaceGroup
from training.launch.inplace_board import EtcdBoard
from training.launch.rendezvous.client import EtcdClient

#: The issue's target for the survivors' time from the kill to their next completed training collective (#52).
TARGET_S = 1.0


def events(path) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def stop_at(root, step: int) -> None:
    """Tell every rank the step to stop at (``<root>/STOP``), whole: the ranks poll for the file and read it once."""
    (root / "STOP.tmp").write_text(str(step))
    os.replace(root / "STOP.tmp", root / "STOP")


def wait_for(what: str, check, agent: subprocess.Popen, err, timeout_s: float = 15.0):
    """``check()``'s first truthy answer; fails naming ``what`` (and the ranks' errors, if their agent ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        assert agent.poll() is None, f"while waiting for {what}, a rank failed: {err.read_text()[-3000:]}"
        time.sleep(0.05)
    pytest.fail(f"{what} did not happen within {timeout_s:.0f} s: {err.read_text()[-3000:]}")


class Ranks:
    """The harness's ranks (tests/support/inplace_worker) in ``root``: their events, their steps, a bounded wait."""

    def __init__(self, root, env: dict, *args: str):
        self.root, self.err = root, root / "ranks.err"
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "tests.support.inplace_worker", "--dir", str(root), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.err, "w"),
        )

    def log(self, member: str) -> list[dict]:
        return events(self.root / f"{member}.jsonl")

    def last_step(self, member: str) -> int:
        return max((e["step"] for e in self.log(member) if e["event"] == "step"), default=-1)

    def until(self, what: str, check, timeout_s: float = 15.0):
        return wait_for(what, check, self.agent, self.err, timeout_s)

    def close(self) -> None:
        if self.agent.poll() is None:
            self.agent.kill()  # its members die with it (parent-death signal)
            self.agent.wait()


def test_survivors_keep_their_processes_and_a_joiner_gets_their_state(etcd, tmp_path):
    env = {**os.environ, **etcd.add_job_user("inplace").as_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # w0-w2 form the first group; w3, a process with no state, joins once GO appears (tests/support/inplace_worker);
    # w0 leaves a thread blocked on w1 in a subgroup of the first group (as an abandoned checkpoint save can be)
    ranks = Ranks(tmp_path, env, "--first", "w0,w1,w2", "--joiners", "w3", "--left-over")
    agent, err, log, last_step, until = ranks.agent, ranks.err, ranks.log, ranks.last_step, ranks.until

    try:
        until("three ranks at step 10", lambda: min(last_step(m) for m in ("w0", "w1", "w2")) >= 10, timeout_s=40)
        pids = {m: log(m)[0]["pid"] for m in ("w0", "w1", "w2")}
        killed_at = time.time()
        os.kill(pids.pop("w2"), signal.SIGKILL)  # its agent reaps it and reports it gone, as a real agent's waitpid
        until("both survivors' recovery", lambda: all(any(e["event"] == "recovered" for e in log(m)) for m in pids))
        recovered = {m: next(e for e in log(m) if e["event"] == "recovered") for m in pids}
        for m, e in recovered.items():
            print(
                f"{m}: kill -> collective raised {e['failed_at'] - killed_at:.3f} s, -> next step's collective "
                f"{e['next_collective_at'] - killed_at:.3f} s (release {e['release_s']:.3f}, agree {e['agree_s']:.3f}, "
                f"build {e['build_s']:.3f})"
            )
            assert e["world"] == 2 and e["pid"] == pids[m]
        worst = max(e["next_collective_at"] for e in recovered.values()) - killed_at
        assert worst <= TARGET_S, f"the survivors' next collective came {worst:.2f} s after the kill"
        # the survivors cut what their first group still held open: the work left on it ends now, not at its
        # collective's timeout (300 s; it held the worker's exit that long, which joins its threads)
        ended = until(
            "w0's left-over collective ended", lambda: [e for e in log("w0") if e["event"] == "left_over_ended"]
        )
        print(f"w0's left-over collective: ended {ended[0]['t'] - killed_at:.3f} s after the kill: {ended[0]['error']}")
        assert "Connection closed" in ended[0]["error"] and ended[0]["t"] > killed_at
        assert sum(e["connections"] for m in pids for e in log(m) if e["event"] == "cut_left_over") >= 1

        at_two = last_step("w0")
        until("steps at world 2", lambda: last_step("w0") >= at_two + 3)
        (tmp_path / "GO").write_text("")
        until("w3 joining at world 3", lambda: any(e["event"] == "formed" for e in log("w3")))
        joined = next(e for e in log("w3") if e["event"] == "formed")
        # a world of 3 again; the survivors kept ranks 0 and 1, and w3 took their step
        assert (joined["world"], joined["rank"]) == (3, 2) and joined["step"] > at_two
        until("steps at world 3", lambda: last_step("w3") >= joined["step"] + 3)
        stop_at(tmp_path, max(last_step(m) for m in ("w0", "w1", "w3")) + 25)
        assert agent.wait(timeout=20) == 0, err.read_text()[-3000:]
    finally:
        ranks.close()

    done = {m: next(e for e in log(m) if e["event"] == "done") for m in ("w0", "w1", "w3")}
    assert {m: done[m]["pid"] for m in pids} == pids  # the survivors finished in the processes they started in
    assert all(e["pid"] == pids[m] for m in pids for e in log(m) if e["event"] == "formed")
    worlds = {int(s): w for s, w in done["w0"]["worlds"].items()}
    assert sorted(worlds) == list(range(done["w0"]["step"]))  # every step exactly once, the rolled-back one too
    runs = [w for i, w in enumerate(worlds[s] for s in sorted(worlds)) if i == 0 or w != worlds[sorted(worlds)[i - 1]]]
    assert runs == [3, 2, 3]
    expected = sum(w * (s + 1) for s, w in worlds.items())
    assert {m: d["acc"] for m, d in done.items()} == {m: float(expected) for m in done}


def test_survivors_blocked_on_a_silent_member_cut_their_group_at_their_agents_note_and_keep_their_processes(
    etcd, tmp_path, monkeypatch
):
    """A member stops (SIGSTOP: its sockets stay open), so its peers' all_reduce blocks: gloo's abort cannot end it
    and nothing does for ``pg_timeout_s`` (10 s here). Their agent's note (``cut-<pid>``, what the in-place agent
    writes once the silent node's ranks are reported lost) makes each survivor's watcher shut its group's
    connections: the collective raises, and both recover at world 2 in their processes, with correct sums after."""
    notes = tmp_path / "notes"
    notes.mkdir()
    creds = etcd.add_job_user("inplace-cut")
    env = {**os.environ, **creds.as_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["T5F_HEARTBEAT_DIR"] = str(notes)
    ranks = Ranks(tmp_path, env, "--first", "w0,w1,w2")
    agent, err, log, last_step, until = ranks.agent, ranks.err, ranks.log, ranks.last_step, ranks.until

    board = EtcdBoard(EtcdClient(creds))
    try:
        until("three ranks at step 10", lambda: min(last_step(m) for m in ("w0", "w1", "w2")) >= 10, timeout_s=40)
        pids = {m: log(m)[0]["pid"] for m in ("w0", "w1", "w2")}
        silent = pids.pop("w2")
        os.kill(silent, signal.SIGSTOP)
        stopped_at = last_step("w2")
        time.sleep(1.5)  # without the note nothing ends the survivors' collective (their pg_timeout_s is 10 s)
        assert not any(e["event"] == "recovered" for m in pids for e in log(m))
        assert all(last_step(m) <= stopped_at + 1 for m in pids)  # blocked, not training on

        epoch = board.latest().epoch
        board.report_gone(board.latest().members[2], node_lost=True)  # the spare's agent, taking its ranks
        monkeypatch.setenv("T5F_HEARTBEAT_DIR", str(notes))
        for pid in pids.values():  # what the survivors' agent writes (training.job.agent_notes)
            assert request_cut(pid, epoch, "a node was lost")
        until("both survivors' recovery", lambda: all(any(e["event"] == "recovered" for e in log(m)) for m in pids))
        recovered = {m: next(e for e in log(m) if e["event"] == "recovered") for m in pids}
        assert all(e["world"] == 2 and e["pid"] == pids[m] for m, e in recovered.items())
        at_two = last_step("w0")
        until("steps at world 2", lambda: min(last_step(m) for m in pids) >= at_two + 3)
        os.kill(silent, signal.SIGKILL)
        stop_at(tmp_path, max(last_step(m) for m in pids) + 5)
        assert agent.wait(timeout=20) == 0, err.read_text()[-3000:]
    finally:
        ranks.close()

    # the first survivor's cut closes its connections to the other, whose collective then raises as on a lost peer
    # (its own note finds its group released already: nothing left to cut)
    said = err.read_text()
    cut = [
        m
        for m in pids
        if f"[inplace] epoch {epoch}: {m} cut its group at its agent's request (a node was lost)" in said
    ]
    assert cut, said[-3000:]
    done = {m: next(e for e in log(m) if e["event"] == "done") for m in pids}
    assert {m: d["pid"] for m, d in done.items()} == pids
    worlds = {int(s): w for s, w in done["w0"]["worlds"].items()}
    assert sorted(worlds) == list(range(done["w0"]["step"]))
    assert {m: d["acc"] for m, d in done.items()} == {
        m: float(sum(w * (s + 1) for s, w in worlds.items())) for m in done
    }


def test_a_reformation_not_agreed_within_its_bound_says_so_and_falls_back(etcd, capfd):
    """Epoch 1 held members a and b; b is gone and two members are needed: a's recovery gives up at its bound with
    one line and the InPlaceFailed the caller turns into today's full restart."""
    board = EtcdBoard(EtcdClient(etcd.add_job_user("inplace-alone")))
    settings = GroupSettings(agreement=AgreementSettings(gather_s=0.1, bound_s=1.0, min_members=2))
    group = InPlaceGroup(board, "a", settings)
    group.membership = board.decide(Membership(1, ("a", "b"), 7, group.store_addr))
    t = time.monotonic()
    with pytest.raises(InPlaceFailed) as raised:
        group.recover(7)
    took = time.monotonic() - t
    group.close()
    assert 1.0 <= took < 2.0
    said = capfd.readouterr().err.splitlines()
    assert said == [f"[inplace] {raised.value}"]
    assert "epoch 2 not agreed within 1 s (1 checked in, 2 needed)" in said[0]
    assert "falling back to a full restart" in said[0]
    assert board.decision(2) is None and board.latest().epoch == 1  # nothing half-decided is left behind
    assert EtcdBoard(board.client, scope="1").latest() is None  # a full restart's workers start a scope of their own


def test_a_member_lost_between_the_decision_and_the_new_group_falls_back_at_the_bound(etcd, capfd):
    """A second failure during the recovery: b checked in and was decided, then died before its group formed."""
    board = EtcdBoard(EtcdClient(etcd.add_job_user("inplace-second")))
    settings = GroupSettings(agreement=AgreementSettings(gather_s=0.1, bound_s=1.0))
    group = InPlaceGroup(board, "a", settings)
    group.membership = board.decide(Membership(1, ("a", "b", "c"), 7, group.store_addr))
    board.decide(Membership(2, ("a", "b"), 7, group.store_addr))
    t = time.monotonic()
    with pytest.raises(InPlaceFailed) as raised:
        group.recover(7)
    took = time.monotonic() - t
    group.close()
    assert 1.0 <= took < 2.0
    said = [line for line in capfd.readouterr().err.splitlines() if "[c10d]" not in line]  # torch's own warnings
    assert said == [f"[inplace] {raised.value}"]
    assert str(raised.value).startswith("in-place recovery: the group of epoch 2 did not form within 1 s")
    assert str(raised.value).endswith("falling back to a full restart from the newest complete snapshot")


def test_recover_inside_an_except_block_is_refused_naming_the_fix(etcd):
    """Inside the except block the caught exception's traceback holds the failed collective's group: its
    connections stay open and a peer blocked on this member waits for its timeout (measured 1.0 s against 11 ms)."""
    group = InPlaceGroup(EtcdBoard(EtcdClient(etcd.add_job_user("inplace-except"))), "a", GroupSettings())
    group.membership = Membership(1, ("a", "b"), 7, group.store_addr)
    try:
        raise RuntimeError("Connection closed by peer")
    except RuntimeError:
        with pytest.raises(RuntimeError, match=r"recover\(\) called inside an except block.*call recover\(\) after it"):
            group.recover(7)
    group.close()

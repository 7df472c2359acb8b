"""The in-place agent (training.launch.inplace_agent) with real worker processes, torch's c10d rendezvous and the
job's board on a real etcd: a worker killed by a signal is reported gone and replaced alone (its peers' processes
kept, no restart counted); a second failure while the replacement has not joined, a worker's own exit code, and
the replacement's failure are the group's full restart, counted against max_restarts until none is left.

The workers are plain ``python -c`` processes (no torch): each notes its rank, pid and restart count in a file and
waits for the test's flag files (the trainer's side is tests/e2e/failover/test_inplace_agent_e2e.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig

from training.job.failover import member_id
from training.job.inplace.agreement import CheckIn, Membership
from training.launch import inplace_agent
from training.launch.inplace_board import EtcdBoard
from training.launch.rendezvous.client import EtcdClient

WORKER = """
import os, pathlib, sys, time
d = pathlib.Path(sys.argv[1])
me = f"{os.environ['RANK']}-{os.getpid()}-{os.environ['TORCHELASTIC_RESTART_COUNT']}"
(d / f"w-{me}").touch()
while not (d / "done").exists() and not (d / f"exit0-{os.getpid()}").exists():
    if (d / f"exit1-{os.getpid()}").exists():
        sys.exit(1)
    time.sleep(0.02)
"""


def workers(d: Path) -> dict[int, tuple[int, int]]:
    """The newest worker of each rank: rank -> (pid, restart count), from the files they wrote."""
    newest: dict[int, tuple[float, int, int]] = {}
    for f in d.glob("w-*"):
        rank, pid, count = map(int, f.name[2:].split("-"))
        t = f.stat().st_mtime_ns
        if rank not in newest or t > newest[rank][0]:
            newest[rank] = (t, pid, count)
    return {r: (pid, count) for r, (_, pid, count) in newest.items()}


def wait_for(what, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s: {what.__doc__ or what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Agent:
    """The in-place agent over three such workers in a thread (torch's c10d rendezvous, one node), its board on the
    test's etcd in a scope per start of the group (``rounds``), its outcome and what it said."""

    def __init__(self, etcd, tmp_path: Path, capfd, job: str, max_restarts: int, blocked_s: float = 1.0):
        client = EtcdClient(etcd.add_job_user(job))
        self.rounds: list[EtcdBoard] = []

        def board_for_round() -> EtcdBoard:  # each start of the group: the next round's scope
            self.rounds.append(EtcdBoard(client, scope=str(len(self.rounds))))
            return self.rounds[-1]

        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=3,
            run_id=job,
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",
            max_restarts=max_restarts,
            monitor_interval=0.05,
            logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        )
        self.outcome: list[object] = []
        self.said: list[str] = []
        self.capfd = capfd

        def agent() -> None:
            try:
                self.outcome.append(
                    inplace_agent.launch(
                        config,
                        sys.executable,
                        ["-c", WORKER, str(tmp_path)],
                        board_for_round=board_for_round,
                        member_id=member_id,
                        blocked_s=blocked_s,
                    )
                )
            except BaseException as e:  # noqa: BLE001 - the test reads it
                self.outcome.append(e)

        self.thread = threading.Thread(target=agent, daemon=True)
        self.thread.start()

    def err(self) -> str:
        """What the agent said so far."""
        self.said.append(self.capfd.readouterr().err)
        return "".join(self.said)


def test_one_killed_worker_is_replaced_alone_and_anything_else_restarts_the_group(etcd, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")  # launch() sets it for its contexts
    agent = Agent(etcd, tmp_path, capfd, "inplace-agent", max_restarts=2)
    rounds, outcome, thread, err = agent.rounds, agent.outcome, agent.thread, agent.err
    try:
        first = wait_for(lambda: len(workers(tmp_path)) == 3 and workers(tmp_path))
        assert {count for _, count in first.values()} == {0}

        # a worker killed: reported gone in its round's scope, replaced alone, no restart counted
        os.kill(first[1][0], signal.SIGKILL)
        second = wait_for(lambda: workers(tmp_path)[1] != first[1] and workers(tmp_path))
        assert second[1][1] == 0 and second[0] == first[0] and second[2] == first[2]
        assert alive(first[0][0]) and alive(first[2][0])
        assert rounds[0].gone() == {member_id(1, first[1][0])}

        # it joins (the workers' agreement decides an epoch with it); a later kill is replaced alone again
        members = (member_id(0, first[0][0]), member_id(2, first[2][0]), member_id(1, second[1][0]))
        rounds[0].decide(Membership(epoch=2, members=members, step=1, store="127.0.0.1:1"))
        wait_for(lambda: "the replacement of rank 1 joined (epoch 2, world 3)" in err())
        os.kill(first[0][0], signal.SIGKILL)
        third = wait_for(lambda: workers(tmp_path)[0] != first[0] and workers(tmp_path))
        assert third[0][1] == 0 and third[1] == second[1] and third[2] == first[2] and len(rounds) == 1

        # a second failure while that replacement has not joined: the full restart (restart 1)
        os.kill(first[2][0], signal.SIGKILL)
        fourth = wait_for(lambda: {c for _, c in workers(tmp_path).values()} == {1} and workers(tmp_path))
        assert not any(alive(pid) for pid, _ in third.values()) and len(rounds) == 2

        # a worker's own exit code (e.g. 1 after its in-place recovery fell back): the full restart (restart 2)
        (tmp_path / f"exit1-{fourth[2][0]}").touch()
        fifth = wait_for(lambda: {c for _, c in workers(tmp_path).values()} == {2} and workers(tmp_path))

        # a kill is replaced; the replacement's own failure is a full restart, and none is left: the agent fails
        os.kill(fifth[0][0], signal.SIGKILL)
        sixth = wait_for(lambda: workers(tmp_path)[0] != fifth[0] and workers(tmp_path))
        assert rounds[2].gone() == {member_id(0, fifth[0][0])}
        os.kill(sixth[0][0], signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert isinstance(outcome[0], ChildFailedError), outcome
        assert not any(alive(pid) for pid, _ in sixth.values())  # the agent stopped the others
    finally:
        (tmp_path / "done").touch()
        thread.join(timeout=30)
    lines = [line for line in err().splitlines() if line.startswith(inplace_agent.PREFIX)]
    assert any("rank 1 (local rank 1, pid" in line and "died of SIGKILL: reported gone" in line for line in lines)
    assert any("rank 2 (SIGKILL) failed while the replacement of rank 0 was joining" in line for line in lines)
    assert any("worker rank 2 (exit code 1) ended by itself" in line for line in lines)
    assert any("the replacement of rank 0 failed (SIGKILL): full restart" in line for line in lines), lines


def test_the_job_finishing_without_a_replacement_that_never_joined_stops_it(etcd, tmp_path, monkeypatch, capfd):
    """Survivors allowed a smaller world (failover.in_place_min_world) can finish before their replacement is let
    in: the node's other workers ended 0, so the replacement is stopped and the group counts as succeeded, instead
    of failing at its bound into a group restart."""
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")
    agent = Agent(etcd, tmp_path, capfd, "inplace-agent-done", max_restarts=0)
    try:
        first = wait_for(lambda: len(workers(tmp_path)) == 3 and workers(tmp_path))
        os.kill(first[1][0], signal.SIGKILL)
        second = wait_for(lambda: workers(tmp_path)[1] != first[1] and workers(tmp_path))
        for rank in (0, 2):
            (tmp_path / f"exit0-{first[rank][0]}").touch()
        agent.thread.join(timeout=30)
        assert agent.outcome == [{0: None, 1: None, 2: None}]
        assert not alive(second[1][0])
    finally:
        (tmp_path / "done").touch()
        agent.thread.join(timeout=30)
    assert (
        f"{inplace_agent.PREFIX} the job finished without needing the replacement of rank 1: stopped it" in agent.err()
    )


def test_a_worker_left_blocked_while_its_peers_recover_is_killed_and_replaced(etcd, tmp_path, monkeypatch, capfd):
    """gloo cannot cut a blocked collective: a survivor not talking to the dead rank can stay blocked on survivors
    that already left for the next epoch. Two workers of epoch 1 check in to epoch 2; the third never does (it is
    blocked): ``blocked_s`` later its agent SIGKILLs it, reports it gone and starts its replacement, no restart
    counted; the two that checked in keep their processes. Without a peer's check-in nobody is killed."""
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")
    agent = Agent(etcd, tmp_path, capfd, "inplace-agent-blocked", max_restarts=0)
    try:
        first = wait_for(lambda: len(workers(tmp_path)) == 3 and workers(tmp_path))
        board = agent.rounds[0]
        members = tuple(member_id(r, first[r][0]) for r in range(3))
        board.decide(Membership(epoch=1, members=members, step=-1, store="127.0.0.1:1"))
        time.sleep(1.5)  # an epoch with nobody checked in to the next one: nothing to kill
        assert workers(tmp_path) == first and "has not checked in" not in agent.err()

        for r in (0, 1):  # their collectives failed: they check in to epoch 2
            board.check_in(2, CheckIn(members[r], 4, r, "127.0.0.1:1"))
        second = wait_for(lambda: workers(tmp_path)[2] != first[2] and workers(tmp_path), timeout_s=10)
        assert second[0] == first[0] and second[1] == first[1] and second[2][1] == 0  # no restart counted
        assert board.gone() == {members[2]}
        assert agent.thread.is_alive() and not agent.outcome
    finally:
        (tmp_path / "done").touch()
        agent.thread.join(timeout=30)
    said = [line for line in agent.err().splitlines() if line.startswith(inplace_agent.PREFIX)]
    assert any(f"worker rank 2 (pid {first[2][0]}) has not checked in to epoch 2" in line for line in said), said
    assert any(f"rank 2 (local rank 2, pid {first[2][0]}) died of SIGKILL: reported gone" in line for line in said)


def test_workers_left_blocked_with_a_lost_node_are_killed_and_replaced(etcd, tmp_path, monkeypatch, capfd):
    """A lost node (silent: its peers' collectives block instead of failing): the spare that takes its ranks reports
    their workers lost with their node. This node's workers, members of that epoch, never check in to the next:
    ``lost_blocked_s`` (0.25 s) after the report each is SIGKILLed and replaced (no restart counted), and their
    replacements join as the lost ranks' do; ``blocked_s`` (a peer's check-in) is set far beyond the test's wait, so
    the lost node's report alone kills them. Without the report, or with a plain one (one process gone), nobody is
    killed. The agent's own looks at the board are 600 s apart here: only its watch of the gone/ reports
    (``_watch_reports``) can bring the look that finds them blocked."""
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")
    monkeypatch.setattr(inplace_agent, "BLOCKED_LOOK_S", 600.0)
    agent = Agent(etcd, tmp_path, capfd, "inplace-agent-lost-node", max_restarts=0, blocked_s=600)
    try:
        first = wait_for(lambda: len(workers(tmp_path)) == 3 and workers(tmp_path))
        board = agent.rounds[0]
        lost = member_id(3, 999_999)  # the lost node's worker, rank 3
        members = (*(member_id(r, first[r][0]) for r in range(3)), lost)
        board.decide(Membership(epoch=1, members=members, step=-1, store="127.0.0.1:1"))
        time.sleep(1.5)  # nobody gone, nobody checked in: nothing to kill
        assert workers(tmp_path) == first and "has not checked in" not in agent.err()

        board.report_gone(lost)  # one process gone: its peers' collectives fail, they check in; no kill here
        time.sleep(1.5)
        assert workers(tmp_path) == first and "has not checked in" not in agent.err()
        board.report_gone(lost, node_lost=True)  # the spare's agent, taking rank 3 of a lost node
        second = wait_for(lambda: all(workers(tmp_path)[r] != first[r] for r in range(3)) and workers(tmp_path))
        assert all(second[r][1] == 0 for r in range(3))  # replaced, no restart counted
        assert board.gone() == set(members)
        assert agent.thread.is_alive() and not agent.outcome
    finally:
        (tmp_path / "done").touch()
        agent.thread.join(timeout=30)
    said = [line for line in agent.err().splitlines() if line.startswith(inplace_agent.PREFIX)]
    assert sum("has not checked in to epoch 2" in line for line in said) == 3, said
    assert all("after a node was lost" in line for line in said if "has not checked in" in line), said


def test_a_round_that_does_not_keep_the_workers_kills_them_at_once(etcd, tmp_path, monkeypatch, capfd):
    """A lost node that cannot be replaced in place (no spare, a stuck node) forms a round in which every worker
    starts again, and the rendezvous tells the agent to SIGKILL this node's workers (``notify_lost``). The node
    watchdog finds workers by their heartbeat files, which a worker in an in-place recovery has closed (these plain
    workers have none either), so only the in-place agent's own kill reaches them: without it they ran on until
    their recovery's bound ran out (``node-loss-rejoin`` with in place: 9.7 s of a 12.0 s recovery)."""
    from training.launch.rendezvous import handler as etcd_handler

    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")
    agent = Agent(etcd, tmp_path, capfd, "inplace-agent-lost-round", max_restarts=1)
    try:
        first = wait_for(lambda: len(workers(tmp_path)) == 3 and workers(tmp_path))
        etcd_handler.notify_lost("node-x")
        wait_for(lambda: not any(alive(pid) for pid, _ in first.values()), timeout_s=5.0)
        pids = ", ".join(str(first[r][0]) for r in sorted(first))
        assert f"{inplace_agent.PREFIX} SIGKILLed worker pid(s) {pids}: their round lost node-x" in agent.err()
    finally:
        (tmp_path / "done").touch()
        agent.thread.join(timeout=30)
    assert not agent.thread.is_alive()
    etcd_handler.notify_lost("node-y")  # the agent ended: its kill is no longer registered
    assert "their round lost node-y" not in agent.err()


def test_the_boards_watch_of_gone_reports_calls_back_on_each_report(etcd):
    """``EtcdBoard.watch_gone``: what wakes an in-place agent when a process or node is reported gone."""
    board = EtcdBoard(EtcdClient(etcd.add_job_user("inplace-watch-gone")), scope="7")
    seen = threading.Semaphore(0)
    watch = board.watch_gone(seen.release)
    try:
        assert seen.acquire(timeout=20)  # the watch's first resync
        board.report_gone("r00003-h-1", node_lost=True)
        assert seen.acquire(timeout=20)
        EtcdBoard(board.client, scope="8").report_gone("r00001-h-2")  # another scope's report: not this watch's
        board.report_gone("r00002-h-3")
        assert seen.acquire(timeout=20)
        assert {kv.key.rpartition("/")[2] for kv in watch.under(board.root + "gone/")} == {"r00003-h-1", "r00002-h-3"}
    finally:
        watch.stop(join_s=5)

"""Straggler detection: the rule on work times measured on this machine, the work clock on a real FSDP2 model, the
notes between an agent and its workers."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from training.job import agent_notes
from training.job.stragglers import TAKEN_OUT_FILE, StragglerRule, WorkClock, window_opens_at

# Forward work times (s; the first measurement, forward only) of ranks 0 and 1, debug preset, 2 processes x 1
# thread on the shared 2-core machine (docs/failover.md): ordinary steps, then rank 1's process stopped 0.2 s of
# every 0.3 s.
NORMAL = [
    (0.2713, 0.2881),
    (0.2837, 0.3189),
    (0.2717, 0.2981),
    (0.2127, 0.2532),
    (0.2271, 0.2747),
    (0.1869, 0.1821),
    (0.4192, 0.4871),
    (0.2614, 0.2405),
]
SLOWED = [
    (0.1894, 0.431),
    (0.1575, 0.5627),
    (0.1653, 0.5771),
    (0.1644, 0.5668),
    (0.2593, 0.6266),
    (0.1679, 0.3592),
    (0.2881, 0.8803),
    (0.287, 0.4565),
]


def test_ordinary_noise_names_nobody_and_a_stopped_rank_is_named_after_m_steps():
    rule = StragglerRule(factor=2.0, steps=3)
    assert all(rule.observe(list(t)) is None for t in NORMAL * 3)
    found = [rule.observe(list(t)) for t in SLOWED]
    assert found[:2] == [None, None]  # two slow steps are not yet a straggler
    named = found[2]
    assert named is not None and named.rank == 1 and named.steps == 3
    assert named.work_s == 0.5771 and named.median_s == 0.1653 and named.ratio == pytest.approx(3.49, abs=0.01)
    assert found[7] is None  # x1.6: the streak is broken, the episode over


def test_a_slowdown_on_every_rank_names_nobody_and_the_others_median_is_used():
    rule = StragglerRule(factor=2.0, steps=2)
    for _ in range(5):  # everyone 3x slower (a slow storage write, a long batch): relative times unchanged
        assert rule.observe([0.9, 0.95, 0.88, 0.92]) is None
    # Of four ranks one is 2.5x the median of the *other three*; with the median of all four it would read 1.9x
    assert rule.observe([0.2, 0.21, 0.5, 0.19]) is None
    named = rule.observe([0.2, 0.21, 0.5, 0.19])
    assert named is not None and named.rank == 2 and named.median_s == 0.2


def test_the_work_clock_times_fsdp_blocks_forward_and_starts_over(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        class Slow(torch.nn.Module):
            def forward(self, x):
                time.sleep(0.05)  # the block's own work
                return x

        model = torch.nn.Sequential(torch.nn.Linear(4, 4), Slow(), torch.nn.Linear(4, 4))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

        class SlowSGD(torch.optim.SGD):
            def step(self, closure=None):
                time.sleep(0.08)  # the optimizer's own work
                return super().step(closure)

        torch.optim.SGD(model.parameters(), lr=0.1)  # torch now wraps SGD.step too: SlowSGD's hooks nest
        optimizer = SlowSGD(model.parameters(), lr=0.1)
        clock = WorkClock(model, torch.device("cpu"), optimizer)
        assert len(clock.blocks) == 3  # the blocks, not the root
        model(torch.ones(2, 4)).sum().backward()
        forward = clock.take()
        assert 0.05 <= forward < 0.5  # the sleeping block's forward
        optimizer.step()
        assert 0.08 <= clock.take() < 0.5  # the optimizer step
        assert clock.take() == 0.0  # started over
    finally:
        dist.destroy_process_group()


def test_agent_notes_go_through_the_heartbeat_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(agent_notes.HEARTBEAT_DIR_ENV, raising=False)
    assert agent_notes.spares_waiting() == 0 and not agent_notes.request_take_out("x")  # no agent: no spare
    monkeypatch.setenv(agent_notes.HEARTBEAT_DIR_ENV, str(tmp_path))
    assert agent_notes.spares_waiting() == 0 and agent_notes.take_out_request() is None
    agent_notes.publish_spares(2)
    assert agent_notes.spares_waiting() == 2
    assert agent_notes.request_take_out("rank 1 is a straggler\n")
    assert agent_notes.take_out_request() == "rank 1 is a straggler"
    assert agent_notes.take_out_request() == "rank 1 is a straggler"  # every later question: the same answer


def test_a_node_is_taken_out_only_with_a_spare_a_restart_the_window_open_and_a_snapshot():
    from training.job.stragglers import Row, decide

    def rows(spares=(0, 1), restarts=(2, 2), window=(1, 1)):
        return [Row(0.2, i, spares[i], restarts[i], window[i]) for i in range(2)]

    kw = dict(step=9, snapshot_due=True, last_step=16, window_s=600)
    assert decide(rows(), **kw) == (
        True,
        "taking its node out after the in-memory snapshot of step 9: a hot spare takes its place",
    )  # one agent's view of a spare is enough
    assert decide(rows(spares=(0, 0)), **kw) == (False, "no hot spare waits: the job keeps its size")
    assert "no restart left" in decide(rows(restarts=(2, 0)), **kw)[1]
    assert "less than straggler.evict_window_s 600 s ago" in decide(rows(window=(0, 1)), **kw)[1]
    assert "named, never taken out" in decide(rows(window=(0, 0)), **{**kw, "window_s": 0})[1]
    assert "waiting for a step with an in-memory snapshot" in decide(rows(), **{**kw, "snapshot_due": False})[1]
    assert not decide(rows(), **{**kw, "step": 16})[0]  # the last step: nothing left to train


def test_the_eviction_window_opens_with_time_inside_an_attempt(tmp_path):
    # An attempt starts right after the take-out that restarted it, so the window is closed then; it must open
    # window_s after the take-out in the same attempt (the soak found a second straggler left in the job for 3
    # minutes): StragglerWatch reads the take-out time once and compares the clock with this at every step.
    f = tmp_path / TAKEN_OUT_FILE
    assert window_opens_at(f, 30) == 0.0  # no take-out yet: open at once
    taken_out = time.time() - 10
    f.write_text(f"{taken_out:.3f}\n")
    assert window_opens_at(f, 30) == pytest.approx(taken_out + 30, abs=0.001)  # closed for 20 s more
    assert time.time() < window_opens_at(f, 30)
    assert time.time() >= window_opens_at(f, 5)  # a window that has run out since: open now
    assert window_opens_at(f, 0) == math.inf  # window 0: named, never taken out


def test_a_rank_slowed_part_of_the_time_is_named_though_one_step_reads_ordinary():
    """A stopped rank whose stop missed its timed work in one step (1.6x, below k) is still named on the next slow
    step: M of the last 2M-1, not M in a row (which restarted the count and took 3-8 slowed steps in the chaos
    straggler)."""
    rule = StragglerRule(factor=2.0, steps=3)
    pattern = [(0.19, 0.43), (0.16, 0.56), (0.2, 0.32), (0.17, 0.58)]  # slow, slow, ordinary (x1.6), slow
    found = [rule.observe(list(t)) for t in pattern]
    assert found[:3] == [None, None, None]
    assert found[3] is not None and found[3].rank == 1 and found[3].steps == 3


def test_slow_steps_further_apart_than_m_in_2m_minus_1_name_nobody():
    rule = StragglerRule(factor=2.0, steps=3)
    ordinary, slow = [0.2, 0.21], [0.2, 0.6]
    for t in [slow, ordinary, ordinary] * 5:  # one slow step in three: never 3 of the last 5
        assert rule.observe(list(t)) is None


def test_a_take_out_settles_the_writes_then_stops_the_stragglers_node_and_hands_the_others_over(tmp_path, monkeypatch):
    """Every rank waits for the step's checkpoint writes first; the straggler's node's workers leave the take-out
    note and raise Regroup (their agent leaves); the others raise PeerTakenOut, a Regroup that an in-place job
    catches instead (training.job.failover.InPlace.peer_lost) so they recover in place."""
    from training.config import Config
    from training.errors import PeerTakenOut, Regroup
    from training.job.failover import FullRestart, InPlace
    from training.job.stragglers import Straggler, StragglerWatch

    monkeypatch.setenv(agent_notes.HEARTBEAT_DIR_ENV, str(tmp_path / "notes"))
    (tmp_path / "notes").mkdir()
    monkeypatch.setenv("GROUP_RANK", "1")
    settled = []

    class Metrics:
        def info(self, line):
            pass

        def event(self, *a, **kw):
            pass

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        watch = StragglerWatch(
            Config().straggler,
            clock=None,
            rank=0,
            world=1,
            out_dir=str(tmp_path),
            snapshot_due=lambda step: True,
            settle=lambda: settled.append("settled"),
            metrics=Metrics(),
            restarts_left=1,
            last_step=16,
        )
        slow = Straggler(rank=0, work_s=0.6, median_s=0.2, steps=3)  # (a world of one: rank 0 is all there is)
        with pytest.raises(PeerTakenOut) as other:
            watch._leave(slow, node=0, step=9)  # this worker is on node 1: a survivor
        assert settled == ["settled"] and agent_notes.take_out_request() is None
        assert isinstance(other.value, Regroup) and other.value.exit_code == 8  # without in-place: stops as before
        assert InPlace.peer_lost(other.value).startswith("a straggler's node left: rank 0 (node 0")
        assert FullRestart.peer_lost(other.value) == "" and not FullRestart.catches
        with pytest.raises(Regroup) as mine:
            watch._leave(slow, node=1, step=9)  # this worker's node is the straggler's
        assert not isinstance(mine.value, PeerTakenOut) and InPlace.peer_lost(mine.value) == ""
        assert settled == ["settled"] * 2 and "taken out after step 9" in agent_notes.take_out_request()
        assert (tmp_path / TAKEN_OUT_FILE).exists()  # rank 0 opened a new eviction window
    finally:
        dist.destroy_process_group()

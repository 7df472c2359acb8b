"""The progress tracker: bounds follow what was observed; a main thread stuck outside a collective is a stall,
one waiting for a peer inside torch.distributed is not; the heartbeat payload; the process-group timeout rule."""

import pytest

from training.job.progress import (
    CHECKPOINT,
    DATA,
    FINAL_CHECKPOINT,
    FORWARD_BACKWARD,
    OPTIMIZER,
    STARTUP,
    Heartbeat,
    ProgressTracker,
)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def tracker(clock, **kw):
    args = dict(
        floor_s=5.0, multiple=4.0, warmup=2, startup_s=300.0, train_timeout_s=60.0, checkpoint_floor_s=30.0, clock=clock
    )
    return ProgressTracker(**{**args, **kw})


def run_steps(t, clock, n, *, forward_s=0.5, other_s=0.1, first=1):
    for step in range(first, first + n):
        t.enter(DATA, step)
        clock.t += other_s
        t.enter(FORWARD_BACKWARD)
        clock.t += forward_s
        t.enter(OPTIMIZER)
        clock.t += other_s
        t.step_done(step)


def test_bounds_are_generous_until_a_phase_was_seen_then_follow_the_slowest():
    clock = Clock()
    t = tracker(clock)
    assert t.bound(STARTUP)[0] == 300 and t.bound(FORWARD_BACKWARD)[0] == 300
    run_steps(t, clock, 1, forward_s=0.5)
    assert t.bound(FORWARD_BACKWARD)[0] == 300  # seen once, warmup 2
    run_steps(t, clock, 1, forward_s=2.0, first=2)
    assert t.bound(FORWARD_BACKWARD) == (8.0, "max(floor 5 s, 4 x slowest 2.00 s)")  # 4 x the slowest
    assert t.bound(DATA)[0] == 5.0  # fast phases: the floor
    assert t.bound(CHECKPOINT)[0] == 300  # no save yet: generous; after saves, at least checkpoint_floor_s
    for _ in range(3):
        t.enter(CHECKPOINT)
        clock.t += 1.0
        t.enter(DATA)
    assert t.bound(CHECKPOINT)[0] == 30.0
    t.enter(FINAL_CHECKPOINT)  # the synchronous save of a stop or the last step: once, generous
    clock.t += 200
    assert t.bound(FINAL_CHECKPOINT)[0] == 300 and t.stall() is None


def test_a_main_thread_stuck_past_its_bound_is_a_stall_and_not_before():
    clock = Clock()
    t = tracker(clock)
    run_steps(t, clock, 3)
    t.enter(DATA, 4)
    t.enter(FORWARD_BACKWARD)
    clock.t += 4.9
    assert t.stall() is None  # within max(floor 5 s, 4 x 0.5 s)
    clock.t += 0.2
    s = t.stall()
    assert (s.step, s.phase, s.bound_s) == (4, FORWARD_BACKWARD, 5.0) and s.stuck_s == pytest.approx(5.1)
    assert tracker(clock, floor_s=0).stall() is None  # off


def test_the_process_group_timeout_follows_the_slowest_step_after_the_warmup():
    clock = Clock()
    set_to, said = [], []
    t = tracker(clock, set_pg_timeout=set_to.append, say=said.append)
    run_steps(t, clock, 1, forward_s=1.0)
    assert set_to == [60.0]  # after step 1: train_timeout_s, as before
    run_steps(t, clock, 3, forward_s=1.0, first=2)  # a step takes 1.2 s: 2 x max(5, 4 x 1.2) = 10 s
    assert set_to == [60.0, 10.0] and "process-group timeout 10.0 s from step 3" in said[0]
    run_steps(t, clock, 1, forward_s=20.0, first=5)  # a slow step raises it, up to train_timeout_s
    run_steps(t, clock, 1, first=6)
    assert set_to[-1] == 60.0


def test_the_heartbeat_payload_round_trips_and_other_values_are_not_beats():
    hb = Heartbeat(7, 12, FORWARD_BACKWARD)
    assert Heartbeat.from_json(hb.to_json()) == hb
    assert hb.to_json() == '{"beat":7,"step":12,"phase":"forward_backward"}'
    assert Heartbeat.from_json("done") is None and Heartbeat.from_json("41") is None

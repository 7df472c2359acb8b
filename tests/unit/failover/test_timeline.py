"""The chaos timeline PNG: what it draws for a node loss, a restart that recomputes steps, checkpoints and a rejoin.

The records are in the job's metrics.jsonl format (``analysis.parse_records``), the harness events in the local
cluster's format, and the recovery figures come from ``analysis.recovery`` as the verdict computes them.
"""

import json
import struct

import pytest

from training.goodput.analysis import parse_records, recovery, split_attempts
from chaos.report import ScenarioResult

T0 = 1_000.0
KILL, REJOIN = T0 + 23.0, T0 + 39.5


def _start(t, resumed, world, restarts):
    return {"event": "start", "time": T0 + t, "world_size": world, "restart_count": restarts, "resumed_from": resumed}


def _step(t, n, world):
    return {
        "event": "step",
        "time": T0 + t,
        "step": n,
        "loss": 10.0 - 0.3 * n,
        "world_size": world,
        "step_time_s": 0.8,
        "data_offset": (n - 1) * 8,
    }


def _ckpt(t, n):
    return {"event": "checkpoint", "time": T0 + t, "step": n, "committed": True}


def node_loss_rejoin() -> ScenarioResult:
    """2 nodes, checkpoint every 4: steps 1-6 (checkpoint 4 committed), node killed; the survivor resumes from 4
    at world 1 and recomputes 5 and 6, checkpoints 8; the node rejoins, the group is stopped with SIGTERM and
    checkpoints 10; the full-size group resumes from 10 and finishes at 16."""
    recs = (
        [_start(16, None, 2, 0)]
        + [_step(17 + 0.9 * n, n, 2) for n in range(1, 5)]
        + [_ckpt(21.3, 4)]
        + [_step(17 + 0.9 * n, n, 2) for n in (5, 6)]
        + [_start(29, 4, 1, 1)]
        + [_step(38 + 0.7 * (n - 5), n, 1) for n in range(5, 11)]
        + [_ckpt(41.0, 8), {"event": "signal", "time": T0 + 41.9, "signal": "SIGTERM", "step": 10}, _ckpt(42.4, 10)]
        + [_start(55, 10, 2, 2)]
        + [_step(63 + 0.9 * (n - 11), n, 2) for n in range(11, 17)]
        + [_ckpt(66.2, 12), _ckpt(69.9, 16), {"event": "end", "time": T0 + 70.5, "step": 16}]
    )
    recs = parse_records("\n".join(json.dumps(r) for r in recs) + '\n{"event": "st')  # torn last line
    attempts = split_attempts(recs)
    recoveries = [
        recovery("SIGKILL node", KILL, attempts, [KILL + 0.3], recs, REJOIN),
        recovery("rejoin", REJOIN, attempts, [KILL + 0.3], recs, want_world=2, detect=False),
    ]
    events = [
        {"time": T0 + 16, "kind": "start", "node": 0, "label": "start"},
        {"time": KILL, "kind": "fault", "node": 1, "label": "SIGKILL node"},
        {"time": REJOIN, "kind": "rejoin", "node": 1, "label": "rejoin"},
    ]
    return ScenarioResult(
        name="node-loss-rejoin",
        title="",
        outcome="close",
        passed=True,
        t0=T0,
        timeline=recs,
        recoveries=recoveries,
        events=events,
        world_sizes=[2, 1, 2],
    )


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    from chaos.report import timeline_png

    r = node_loss_rejoin()
    return r, timeline_png(tmp_path_factory.mktemp("tl") / "timeline.png", [r], "title")


def _kinds(marks, *kinds):
    return [m for m in marks if m.kind in kinds]


def test_the_rejoin_is_drawn_as_a_rejoin_not_as_a_failure(drawn):
    r, tl = drawn
    marks = tl.marks[0]
    (fail,) = _kinds(marks, "failure")
    (rejoin,) = _kinds(marks, "rejoin")
    assert (fail.t, fail.label) == (KILL - T0, "SIGKILL node")
    assert fail.detected == pytest.approx(0.3 + KILL - T0)  # injected -> noticed -> training again
    assert fail.t_end == pytest.approx(38.0) and fail.lost == 2  # first step of the world-1 attempt
    assert rejoin.t == REJOIN - T0 and rejoin.t_end == pytest.approx(63.0) and rejoin.value == 2
    # the world size the worker groups ran at, and the step each resumed from
    assert [(m.value, m.step) for m in _kinds(marks, "attempt")] == [(2, 0), (1, 4), (2, 10)]
    assert [(m.t, m.label) for m in _kinds(marks, "signal")] == [(pytest.approx(41.9), "SIGTERM")]


def test_every_committed_checkpoint_gets_a_marker_at_its_time(drawn):
    r, tl = drawn
    want = [(x["time"] - T0, x["step"]) for x in r.timeline if x["event"] == "checkpoint" and x["committed"]]
    assert [(m.t, m.step) for m in _kinds(tl.marks[0], "checkpoint")] == want
    assert [s for _, s in want] == [4, 8, 10, 12, 16]


def test_recomputed_steps_are_marked(drawn):
    r, tl = drawn
    marks = tl.marks[0]
    steps = [x for x in r.timeline if x["event"] == "step"]
    drawn_steps = _kinds(marks, "step", "recomputed", "discarded")
    assert [(m.t, m.step) for m in drawn_steps] == [(x["time"] - T0, x["step"]) for x in steps]  # each record once
    lost = [(m.step, m.t < KILL - T0) for m in _kinds(marks, "discarded")]
    again = [(m.step, m.t > KILL - T0) for m in _kinds(marks, "recomputed")]
    assert lost == [(5, True), (6, True)] and again == [(5, True), (6, True)]  # lost to the kill, then redone
    assert len(again) == r.recoveries[0].steps_lost
    assert [m.step for m in _kinds(marks, "step")] == [1, 2, 3, 4] + list(range(7, 17))


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_is_valid_sane_and_deterministic(drawn, tmp_path):
    from chaos.report import timeline_png

    r, tl = drawn
    data = tl.path.read_bytes()
    w, h = _png_size(data)
    assert 1000 <= w <= 1400 and 400 <= h <= 1000 and len(data) > 20_000
    again = timeline_png(tmp_path / "again.png", [node_loss_rejoin()], "title")
    assert again.path.read_bytes() == data and again.marks == tl.marks
    two = timeline_png(tmp_path / "two.png", [r, node_loss_rejoin()], "title").path.read_bytes()
    assert _png_size(two)[0] == w and _png_size(two)[1] > h  # one block per scenario


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_legend_and_labels_stay_off_the_data(drawn):
    r, tl = drawn
    lanes, labels = tl.lanes[0], tl.labels[0]
    for box in lanes.values():
        assert not _overlap(tl.legend, box)  # the legend sits below every axes
    assert len(labels) >= 3  # the fault, the rejoin, worker-group and checkpoint texts
    ev = lanes["events"]
    for b in labels:
        assert ev[0] <= b[0] and b[2] <= ev[2] and ev[1] <= b[1] and b[3] <= ev[3]  # inside the events lane
        assert not _overlap(b, lanes["steps"]) and not _overlap(b, lanes["loss"])
    assert not any(_overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :])


def test_a_failure_never_recovered_and_a_broken_history_still_draw(tmp_path):
    from training.goodput.analysis import Recovery
    from chaos.report import timeline_png

    recs = (
        [_start(0, None, 2, 0)]
        + [_step(n, n, 2) for n in (1, 3, 4)]  # step 2 missing: no consistent chain
        + [_start(10, 3, 2, 1)]
    )
    r = ScenarioResult(
        name="restarts-exhausted",
        title="",
        outcome="fail",
        t0=T0,
        timeline=recs,
        recoveries=[Recovery("SIGKILL worker", T0 + 5, 0.1, None, None, 1, None)],
        events=[
            {"time": T0 + 5, "kind": "fault", "label": "SIGKILL worker"},
            {"time": T0 + 9, "kind": "relaunch", "label": "relaunch"},
        ],
    )
    tl = timeline_png(tmp_path / "t.png", [r], "title")
    marks = tl.marks[0]
    assert [(m.kind, m.t_end) for m in _kinds(marks, "failure")] == [("failure", None)]
    assert [(m.kind, m.t, m.label) for m in _kinds(marks, "action")] == [("action", 9.0, "relaunch")]
    # resumed from 3: the first attempt's step 4 was lost, steps 1 and 3 kept
    assert [(m.kind, m.step) for m in _kinds(marks, "step", "discarded")] == [
        ("step", 1),
        ("step", 3),
        ("discarded", 4),
    ]
    assert _png_size(tl.path.read_bytes())[0] > 0


def test_a_named_straggler_is_drawn_where_the_job_named_it(tmp_path):
    from chaos.report import timeline_png

    named = {
        "event": "straggler",
        "time": T0 + 9.5,
        "step": 4,
        "rank": 1,
        "node": 1,
        "ratio": 2.6,
        "work_s": 0.9,
        "median_s": 0.35,
        "slow_steps": 3,
        "action": "taking its node out",
    }
    recs = (
        [_start(0, None, 2, 0)]
        + [_step(n, n, 2) for n in (1, 3, 5, 9)]
        + [named]
        + [_start(12, 4, 2, 1)]
        + [_step(12 + n, n, 2) for n in (5, 6)]
    )
    r = ScenarioResult(
        name="straggler",
        title="",
        outcome="bitwise",
        t0=T0,
        timeline=recs,
        recoveries=[],
        events=[{"time": T0 + 4, "kind": "fault", "label": "slow node"}],
    )
    tl = timeline_png(tmp_path / "t.png", [r], "title")
    assert [(m.t, m.step, m.label) for m in _kinds(tl.marks[0], "straggler")] == [(9.5, 4, "straggler: rank 1 x2.6")]
    assert _png_size(tl.path.read_bytes())[0] > 0

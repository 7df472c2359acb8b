"""Report arithmetic of the chaos harness: attempts, effective steps, exactly-once, recovery figures."""

import json

import pytest

from training.goodput.analysis import (
    ChainError,
    effective_steps,
    exactly_once,
    first_detection,
    goodput,
    load_records,
    max_loss_diff,
    parse_records,
    recovery,
    split_attempts,
    torchrun_detections,
)
from chaos.local.config import LocalChaosConfig, LocalChaosConfigError
from chaos.report import ScenarioResult, table, targets

GB = 8


def start(t, resumed=None, world=2):
    return {"event": "start", "time": t, "world_size": world, "restart_count": 0, "resumed_from": resumed}


def step(t, n, world=2, loss=None, dt=1.0):
    return {
        "event": "step",
        "time": t,
        "step": n,
        "loss": loss if loss is not None else 10.0 - n,
        "world_size": world,
        "step_time_s": dt,
        "data_offset": (n - 1) * GB,
    }


def history():
    """Steps 1..6 at world 2, killed; resumed from 4 at world 1 for 5..7, killed before its next checkpoint;
    resumed from 4 again, back at world 2, for 5..10."""
    return (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + [start(20, 4, 1)]
        + [step(20 + n, n, 1) for n in (5, 6, 7)]
        + [start(40, 4)]
        + [step(40 + n, n) for n in range(5, 11)]
        + [{"event": "end", "time": 60, "step": 10}]
    )


def test_split_attempts_and_effective_chain():
    attempts = split_attempts(history())
    assert [a.resumed_from for a in attempts] == [0, 4, 4]
    assert [a.last_step for a in attempts] == [6, 7, 10]
    assert attempts[-1].ended
    eff = effective_steps(attempts)
    assert [r["step"] for r in eff] == list(range(1, 11))
    assert [r["time"] for r in eff][:4] == [1, 2, 3, 4]  # steps 1-4 from the first attempt
    assert all(r["time"] > 40 for r in eff[4:])  # 5-10 from the last; the middle attempt was a dead end
    assert exactly_once(eff, GB, 10) == []


def test_chain_with_a_gap_is_reported():
    recs = [start(0)] + [step(n, n) for n in (1, 2, 4)] + [start(10, 4)] + [step(10 + n, n) for n in (5, 6)]
    with pytest.raises(ChainError, match=r"lacks steps \[3\]"):
        effective_steps(split_attempts(recs))


def test_exactly_once_catches_overlap_and_gap():
    eff = [step(n, n) for n in range(1, 5)]
    eff[2] = dict(eff[2], data_offset=8)  # step 3 re-reads step 2's samples
    problems = exactly_once(eff, GB, 4)
    assert any("overlap" in p for p in problems)
    eff = [step(n, n) for n in (1, 2, 4)]
    assert any("missing [3]" in p for p in exactly_once(eff, GB, 4))
    assert any("gap" in p for p in exactly_once(eff, GB, 4))


def test_recovery_figures_from_logs_and_metrics():
    recs = history()
    attempts = split_attempts(recs)
    logs = [
        (6.5, "E... failed (exitcode: -9) local_rank: 0"),
        (5.0, "step 5/10"),
        (6.9, "[default] Worker group FAILED. 3/3 attempts left"),
    ]
    detections = torchrun_detections(logs)
    assert detections == [6.5, 6.9]
    r = recovery("SIGKILL worker", 6.2, attempts, detections, recs, until=30)
    assert r.detect_s == pytest.approx(0.3)
    assert r.recover_s == pytest.approx(25 - 6.2)  # first step of the attempt that started at 20
    assert r.steps_lost == 2  # 6 completed, resumed from 4
    assert r.restarts == 1 and r.world_after == 1
    # a rejoin is over at the first step back at full size
    rj = recovery("rejoin", 30, attempts, detections, recs, want_world=2, detect=False)
    assert rj.recover_s == pytest.approx(45 - 30) and rj.steps_lost == 3 and rj.detect_s is None


def test_signal_counts_as_detection_and_loses_nothing():
    recs = (
        [start(0)]
        + [step(n, n) for n in range(1, 6)]
        + [{"event": "signal", "time": 5.4, "signal": "SIGTERM", "step": 6}, step(6, 6)]
        + [start(30, 6)]
        + [step(30 + n, n) for n in range(7, 9)]
    )
    attempts = split_attempts(recs)
    assert first_detection(5.1, [], recs) == pytest.approx(5.4)
    r = recovery("SIGTERM all", 5.1, attempts, [], recs)
    assert r.steps_lost == 0 and r.recover_s == pytest.approx(37 - 5.1)


def test_a_recovery_in_place_counts_from_its_record_without_a_new_attempt():
    """failover.in_place: no new attempt; rank 0's ``in_place`` record says the held and resumed steps and the tier,
    the next step says when training went on. Without the record (a job that never recovered) nothing counts."""
    in_place = {"event": "in_place", "time": 7.5, "held_step": 6, "resumed_from": 5, "world_size": 2}
    in_place["restored_from"] = {"tier": "peer", "step": 5}
    recs = [start(0)] + [step(n, n) for n in range(1, 7)] + [in_place] + [step(8 + n, n) for n in range(6, 9)]
    r = recovery("SIGKILL node", 6.2, split_attempts(recs), [6.4], recs, until=30)
    assert (r.recover_s, r.steps_lost, r.restarts, r.tier) == (pytest.approx(14 - 6.2), 1, 0, "peer")
    assert r.detect_s == pytest.approx(0.2)
    assert recovery("SIGKILL node", 6.2, split_attempts(recs), [6.4], recs, until=7.0).recover_s is None  # later
    plain = [x for x in recs if x is not in_place]
    assert recovery("SIGKILL node", 6.2, split_attempts(plain), [6.4], plain, until=30).recover_s is None


def test_goodput_and_loss_diff():
    eff = [step(n, n, dt=2.0) for n in range(1, 6)]
    useful, ratio = goodput(eff, wall_s=20.0)
    assert useful == 10.0 and ratio == 0.5
    ref = [step(n, n) for n in range(1, 6)]
    assert max_loss_diff(eff, ref) == 0.0
    assert max_loss_diff([dict(eff[0], loss=9.5)], ref) == pytest.approx(0.5)


def test_torn_metrics_line_is_ignored(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(start(0)) + "\n" + '{"event": "st')
    assert load_records(p) == [start(0)]
    assert load_records(tmp_path / "missing.jsonl") == []
    assert parse_records('[1, 2]\n{"no": "event"}\n' + json.dumps(start(1))) == [start(1)]


def test_chaos_config_rejects_batch_that_a_smaller_world_cannot_split():
    with pytest.raises(LocalChaosConfigError, match="does not divide by world size 3"):
        LocalChaosConfig(nodes=4, global_batch=8).validate()
    LocalChaosConfig(nodes=3, global_batch=12).validate()
    assert LocalChaosConfig().reference_key() != LocalChaosConfig().reference_key(("--model.dropout", "0"))
    assert LocalChaosConfig(slow_commit_s=1).reference_key() == LocalChaosConfig().reference_key()


def test_the_reference_key_covers_the_code_in_every_room(tmp_path, monkeypatch):
    """The math lives in training/model, data, checkpoint and job: an edit there must invalidate the cached
    reference (only the top level was hashed, which after the move to rooms missed almost all of it)."""
    import shutil
    from chaos.local import config as chaos_config

    fake = tmp_path / "repo"
    shutil.copytree(chaos_config.REPO / "training", fake / "training", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(chaos_config, "REPO", fake)
    before = LocalChaosConfig().reference_key()
    t5 = fake / "training" / "model" / "t5.py"
    t5.write_text(t5.read_text() + "\n# an edit\n")
    assert LocalChaosConfig().reference_key() != before
    agent = fake / "training" / "launch" / "agent.py"  # the launcher does not change the math
    before = LocalChaosConfig().reference_key()
    agent.write_text(agent.read_text() + "\n# an edit\n")
    assert LocalChaosConfig().reference_key() == before


def test_targets_and_table_by_scenario_name():
    from training.goodput.analysis import Recovery

    def res(name, *recs, **kw):
        return ScenarioResult(name=name, title=name, recoveries=list(recs), passed=True, **kw)

    rec = Recovery("SIGKILL worker", 0, 0.5, 8.0, 2, 1, 2)
    node = Recovery("SIGKILL node", 0, 1.0, 20.0, 5, 1, 1)
    rejoin = Recovery("rejoin", 0, None, 11.0, 1, 1, 2)
    results = {"worker-kill": res("worker-kill", rec), "node-loss-rejoin": res("node-loss-rejoin", node, rejoin)}
    rows = {r["target"]: r for r in targets(4, results)}
    assert rows["worker kill -> next step (s)"]["met"]
    assert not rows["node loss -> next step (s)"]["met"]
    assert rows["rejoin -> next full-size step (s)"]["value"] == 11.0
    lost = rows["steps lost on SIGKILL (worker, node, first node)"]
    assert lost["values"] == [2, 5] and not lost["met"]  # 5 > checkpoint interval 4
    text = table([results["worker-kill"], res("node-kill", node, figures={"requeues": 1})], columns=("requeues",))
    lines = text.splitlines()
    assert "requeues" in lines[0]
    row = next(line for line in lines if line.startswith("node-kill"))
    assert row.split()[1:7] == ["PASS", "1.0", "20.0", "5", "1", "1"]


def test_timeline_png_draws_completed_and_failed_scenarios(tmp_path):
    from training.goodput.analysis import Recovery
    from chaos.report import timeline_png

    ok = ScenarioResult(
        name="worker-kill",
        title="x",
        passed=True,
        timeline=history(),
        t0=0.0,
        recoveries=[Recovery("SIGKILL worker", 6.2, 0.3, 18.8, 2, 1, 1)],
        events=[
            {"time": 6.2, "kind": "fault", "label": "SIGKILL worker"},
            {"time": 30, "kind": "rejoin", "label": "rejoin"},
        ],
    )
    failed = ScenarioResult(
        name="restarts-exhausted",
        title="y",
        outcome="fail",
        timeline=history()[:8],
        t0=0.0,
        recoveries=[Recovery("SIGKILL worker", 6.2, 0.3, None, None, 1, None)],
        events=[{"time": 6.2, "kind": "fault", "label": "SIGKILL worker"}],
        figures={"exit codes": {"node0": 1}},
    )
    png = timeline_png(tmp_path / "t.png", [ok, failed], "title").path
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_restart_breakdown_adds_up_to_the_recovery_from_the_workers_own_clock():
    from training.goodput.analysis import BREAKDOWN
    from chaos.report import breakdown_table

    recs = history()
    # the attempt that started at 20: its rank 0 was exec'd at 11.0 and timed its own start-up
    recs[7] = {
        **recs[7],
        "startup": {
            "began": 11.0,
            "exec_time": 11.01,
            "process_start_s": 0.5,
            "imports_s": 4.0,
            "device_init_s": 0.0,
            "process_group_s": 1.5,
            "model_build_s": 1.5,
            "job_setup_s": 0.5,
            "restore_s": 1.0,
        },
    }
    attempts = split_attempts(recs)
    r = recovery("SIGKILL worker", 6.2, attempts, [6.5], recs, until=30)
    assert list(r.breakdown) == list(BREAKDOWN)
    assert r.breakdown["notice"] == pytest.approx(0.3) and r.breakdown["stop_and_rendezvous"] == pytest.approx(4.5)
    assert r.breakdown["first_step"] == pytest.approx(25 - 20)
    # the phases cover the recovery except the gap between the last start-up mark and the start event (none here)
    assert sum(r.breakdown.values()) == pytest.approx(r.recover_s - (20 - (11.0 + 9.0)))
    res = ScenarioResult(name="worker-kill", title="x", passed=True, recoveries=[r])
    text = breakdown_table([res])
    assert "stop_and_rendezvous" in text and "worker-kill" in text and "18.8" in text
    # an attempt without the start-up record (older workers, or a platform without /proc): no breakdown
    recs[7].pop("startup")
    assert recovery("SIGKILL worker", 6.2, split_attempts(recs), [6.5], recs, until=30).breakdown is None

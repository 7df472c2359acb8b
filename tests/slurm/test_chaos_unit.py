"""Chaos harness arithmetic and settings (no cluster): figures from metrics records, table, bad settings."""
from __future__ import annotations

import pytest

from chaos.slurm import ChaosConfig, Outcome, Tail, analyse, parse_metrics, table


def rec(event, t, **kw):
    return {"event": event, "time": float(t), **kw}


def test_figures_from_metrics_records():
    records = [rec("start", 0, restart_count=0, resumed_from=None)]
    records += [rec("step", i, step=i) for i in range(1, 6)]
    records += [rec("checkpoint", 2.5, step=2, committed=True), rec("checkpoint", 4.6, step=4, committed=True)]
    # fault at t=5.5 (after step 5); the next attempt starts at t=20 from step 4, first step at t=25
    records += [rec("start", 20, restart_count=1, resumed_from=4), rec("step", 25, step=5), rec("step", 26, step=6)]
    out = Outcome("b", "x")
    analyse(out, records, t_fault=5.5)
    assert (out.resumed_from, out.newest_committed, out.steps_lost, out.recover_s, out.torchrun_restarts) == \
        (4, 4, 1, 19.5, 1)
    # no fault injected: nothing after-the-fact is computed
    out2 = Outcome("a", "x")
    analyse(out2, records, t_fault=None)
    assert out2.steps_lost is None and out2.recover_s is None


def test_signal_stop_loses_nothing():
    records = [rec("start", 0, restart_count=0, resumed_from=None), rec("step", 1, step=1), rec("step", 2, step=2),
               rec("checkpoint", 2.2, step=2, committed=True), rec("signal", 2.3, signal="SIGTERM", step=2),
               rec("start", 30, restart_count=0, resumed_from=2), rec("step", 33, step=3)]
    out = Outcome("c", "x")
    analyse(out, records, t_fault=1.5)
    assert out.steps_lost == 0 and out.resumed_from == out.newest_committed == 2 and out.recover_s == 31.5


def test_table_and_pass_rule():
    ok = Outcome("a", "kill a node outright -> DOWN", detect_s=12.3, recover_s=40.0, steps_lost=1, requeues=1,
                 bitwise_equal=True, checks={"x": True}, wall_s=70)
    bad = Outcome("b", "kill workers -> restart", checks={"x": True}, error="timed out")
    assert ok.passed and not bad.passed and not Outcome("c", "y").passed
    text = table([ok, bad])
    assert "a: kill a node outright" in text and "PASS" in text and "FAIL" in text and "12.3" in text


@pytest.mark.parametrize("kw, msg", [
    ({"scenarios": "ax"}, "--scenarios"), ({"nodes": 1}, "at least 2 nodes"),
    ({"fault_step": 2, "interval": 2}, "interval (2) < fault step (2)"), ({"fault_step": 12, "steps": 12}, "< steps"),
    ({"kill_node": "middle"}, "--kill-node"),
])
def test_bad_chaos_settings(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ChaosConfig(**kw).validate()


def test_tail_returns_only_complete_lines(tmp_path):
    f = tmp_path / "m.jsonl"
    t = Tail(f)
    assert t.read() == []
    f.write_text('{"event": "start", "time": 1}\n{"event": "st')
    assert [line for _, line in t.read()] == ['{"event": "start", "time": 1}']
    with open(f, "a") as fh:
        fh.write('ep", "time": 2, "step": 1}\n')
    assert parse_metrics([line for _, line in t.read()]) == [{"event": "step", "time": 2, "step": 1}]
    assert parse_metrics(['{"torn', '{"event": "end", "time": 3}']) == [{"event": "end", "time": 3}]

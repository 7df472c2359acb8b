"""The snapshot interval in what a run writes: the step records' snapshot_interval and the snapshot_interval
event reach TensorBoard (a scalar and an events text, read back with TensorBoard's reader) and `make status`'s
screen (tools.status over the goodput ledger), and a damaged one is not taken as a record."""

from __future__ import annotations

import json

from tools.status import Where, screen, snapshot_line
from training.checkpoint.snapshot_budget import Choice
from training.config import MetricsConfig
from training.goodput.analysis import record_problem
from training.goodput.ledger import ledger_from_records
from training.job.metrics import MetricsLogger

AUTO = Choice(6, 0.31, 3.1, 0.02, 10)
OVER = Choice(1, 0.022, 0.45, 0.02, 10, auto=False)


def step(n: int, interval: int) -> dict:
    return dict(
        step=n,
        loss=5.0,
        lr=1e-3,
        grad_norm=2.0,
        tokens_per_s=1000.0,
        step_time_s=0.5,
        ckpt_block_s=0.0,
        snapshot_block_s=0.01,
        snapshot_interval=interval,
        world_size=2,
        restart_count=0,
        data_offset=4 * (n - 1),
        tokens=500,
    )


def run(tmp_path, choice: Choice, intervals: list[int]) -> list[dict]:
    cfg = MetricsConfig(path=str(tmp_path / "metrics.jsonl"), tensorboard_dir=str(tmp_path / "tb"))
    m = MetricsLogger(cfg, rank=0, total_steps=len(intervals))
    m.event("start", world_size=2, restart_count=0, resumed_from=None)
    for n, interval in enumerate(intervals, 1):
        m.step(**step(n, interval))
        if n == 4:
            m.event("snapshot_interval", step=n, **choice.record())
    m.end("finished", len(intervals))
    m.close()
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_shows_the_interval_and_its_choice(tmp_path):
    run(tmp_path, AUTO, [1, 1, 1, 1, 6, 6])
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("job/snapshot_interval")][3:] == [(4, 1.0), (5, 6.0), (6, 6.0)]
    texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("job/events/text_summary")]
    assert AUTO.line() in texts


def test_status_says_the_interval_and_its_cost_against_the_budget(tmp_path):
    ledger = ledger_from_records("run", run(tmp_path, AUTO, [1, 1, 1, 1, 6, 6]), 6)
    assert snapshot_line(ledger) == (
        "memory   in-memory snapshot every 6 step(s): a failure costs at most 6 step(s) "
        "(auto: 1.7% of training time blocked, budget 2%)"
    )
    assert snapshot_line(ledger) in screen(ledger, Where(label="run", running=False), now=ledger.records[-1]["time"])


def test_status_names_a_fixed_interval_over_its_budget_and_an_off_tier(tmp_path):
    ledger = ledger_from_records("run", run(tmp_path, OVER, [1] * 6), 6)
    assert snapshot_line(ledger).endswith(
        "(memory_interval=1: 4.9% of training time blocked, budget 2%; auto would take every 3)"
    )
    (tmp_path / "metrics.jsonl").unlink()
    off = [r for r in run(tmp_path, OVER, [0] * 3) if r["event"] != "snapshot_interval"]
    assert snapshot_line(ledger_from_records("run", off, 3)).startswith("memory   in-memory snapshots off")


def test_records_from_before_say_nothing_and_a_damaged_one_is_not_a_record(tmp_path):
    old = [
        {k: v for k, v in r.items() if k != "snapshot_interval"}
        for r in run(tmp_path, AUTO, [1] * 3)
        if r["event"] != "snapshot_interval"
    ]
    assert snapshot_line(ledger_from_records("run", old, 3)) is None
    assert (
        record_problem({"event": "snapshot_interval", "time": 1.0, "interval": "six"})
        == 'interval is "six", not an integer'
    )
    assert record_problem({"event": "step", "time": 1.0, "step": 1, "world_size": 1, "snapshot_interval": None})

"""`make bench` says what memory_interval=auto takes for the figures it measured: the interval, a snapshot's
blocking as a share of a step, the share of training time at that interval, and the budget."""

from __future__ import annotations

import json

from training import bench
from training.config import load_config


def test_the_report_says_the_interval_auto_takes(tmp_path, capsys):
    memory = {"snapshot_block_s": 0.31, "snapshot_base_step_s": 3.1}
    auto = bench._auto_interval(memory, load_config(["--checkpoint.interval", "50"]).checkpoint)
    assert auto["snapshot_auto_interval"] == 5 and round(auto["snapshot_auto_share"], 4) == 0.02
    row = {
        "preset": "t5-60m",
        "params": 63.1e6,
        "world_size": 2,
        "device": "cpu",
        "step_s": 3.1,
        "tokens_per_s": 353.0,
        "mfu": None,
        "ckpt_block_s": {"async": 0.2, "sync": 2.5, "baseline": 3.0},
        "ckpt_block_over_step": {"async": 0.06, "sync": 0.8, "baseline": 1.0},
        "baseline_over_async": 15.0,
        "step_s_during_async_write": 5.0,
        "snapshot_block_s": 0.31,
        "snapshot_block_over_step": 0.1,
        "snapshot_bytes_per_rank": 4e8,
        "snapshot_copy_s": 0.5,
        "snapshot_step_s": 3.2,
        "snapshot_base_step_s": 3.1,
        "snapshot_over_step": 0.03,
        "restore_memory_s": 0.4,
        "restore_storage_s": 2.0,
        **auto,
    }
    f = tmp_path / "r.json"
    f.write_text(json.dumps(row))
    assert bench.main(["report", str(f)]) == 0
    assert (
        "t5-60m: memory_interval=auto takes every 5 steps: a snapshot blocks 10.0% of a step (capture and wait "
        "for its copy), 2.00% of training time at that interval; budget 2% (checkpoint.memory_budget), at most "
        "every 50 steps (checkpoint.interval)"
    ) in capsys.readouterr().out

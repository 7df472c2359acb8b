"""The metrics file is a record, not the work: a disk that fills after the start checks costs metrics lines,
with one warning, never the run (issue 29: it was an OSError traceback in every rank, then a restart loop)."""

from __future__ import annotations

import json

from training.config import MetricsConfig
from training.job.metrics import MetricsLogger


def fill(directory) -> None:
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass


def step(m: MetricsLogger, n: int) -> None:
    m.step(
        step=n,
        loss=1.0,
        lr=1e-3,
        grad_norm=1.0,
        tokens_per_s=1.0,
        step_time_s=0.1,
        ckpt_block_s=0.0,
        world_size=1,
        tokens=10,
    )


def test_a_full_disk_mid_run_warns_once_and_training_goes_on(tmpfs, capsys):
    disk = tmpfs("metrics", "size=64k")
    path = disk / "metrics.jsonl"
    m = MetricsLogger(MetricsConfig(path=str(path), log_every=100), rank=0, total_steps=100)
    m.event("start", world_size=1)
    step(m, 1)
    fill(disk)
    for n in range(2, 101):  # past the file's last allocated page: raised OSError (ENOSPC) before
        step(m, n)
    m.end("finished", 100)
    m.close()
    out = capsys.readouterr().out
    assert out.count("can no longer be written (No space left on device)") == 1, out
    assert "summary: finished at step 100/100" in out  # the console still reports
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept[0]["event"] == "start" and [r["step"] for r in kept[1:]] == list(range(1, len(kept)))  # intact

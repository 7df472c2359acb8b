"""`python -m training.bench report`: the table and target lines `make bench` prints, from result files."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.e2e
def test_the_bench_run_measures_a_tiny_model_end_to_end(tmp_path):
    """`make bench`'s measuring half (python -m training.bench run under torchrun) on the tiny model: every figure
    the report reads is there. Nothing else runs it in the suite (a broken import there went unnoticed once)."""
    from tests.conftest import TINY, TORCHRUN

    out = tmp_path / "tiny.json"
    r = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "training.bench",
            "run",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--saves",
            "1",
            "--out",
            str(out),
            "--",
            "--job.out_dir",
            str(tmp_path / "run"),
            *TINY,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    figures = json.loads(out.read_text())
    for key in (
        "step_s",
        "tokens_per_s",
        "ckpt_block_s",
        "snapshot_block_s",
        "restore_memory_s",
        "snapshot_auto_interval",
    ):
        assert key in figures, (key, sorted(figures))
    assert figures["step_s"] > 0 and figures["ckpt_block_s"]["async"] >= 0

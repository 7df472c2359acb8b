"""The plain Hugging Face baseline (training.bench_hf) on a tiny T5, on the CPU: a row in the bench's format that
`python -m training.bench report` prints with every row's tokens/s as a multiple of it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY
from training import bench

pytestmark = pytest.mark.integration
SHAPE = TINY[: TINY.index("--checkpoint.memory_interval")]  # the model and batch settings


def test_the_baseline_trains_a_plain_t5_of_the_preset_shape_and_reports_a_row(tmp_path, capsys):
    out = tmp_path / "hf.json"
    r = subprocess.run(
        [sys.executable, "-m", "training.bench_hf", "--steps", "2", "--warmup", "1", "--out", str(out), "--", *SHAPE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(out.read_text())
    assert row["variant"] == "plain HF" and row["device"] == "cpu" and row["precision"] == "fp32"
    assert row["global_batch"] == 4 and row["world_size"] == 1
    assert row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["tflops_per_s"] > 0
    assert row["mfu"] is None  # no peak known for a CPU
    # the same shape as the project's model of these settings
    from training.config import load_config
    from training.model.t5 import build_model, count_params

    assert row["params"] == count_params(build_model(load_config(SHAPE).model, seed=1))
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({**row, "variant": "(preset)", "tokens_per_s": 2 * row["tokens_per_s"]}))
    assert bench.main(["report", str(ours), str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("debug")]
    assert "2.00x" in lines[0] and "1.00x" in lines[1] and lines[1].endswith("plain HF")

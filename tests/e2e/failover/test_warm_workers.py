"""Warm workers (training.launch.warm_workers): torchrun's command for the training module becomes a function
started by a preloaded forkserver; what a warm worker computes is bitwise what a cold one does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY
from training.launch.warm_workers import WARM_ENV


def _train(out, env_extra: dict) -> tuple[dict, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env_extra}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            "2",
            "--",
            *TINY,
            "--job.out_dir",
            str(out),
            "--train.steps",
            "4",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    starts = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in starts if r["event"] == "start"), p.stdout + p.stderr


@pytest.mark.e2e
def test_warm_workers_skip_the_imports_and_train_bitwise_like_cold_ones(tmp_path):
    warm, _ = _train(tmp_path / "warm", {})
    cold, _ = _train(tmp_path / "cold", {WARM_ENV: "0"})
    assert warm["startup"]["preloaded"] is True and cold["startup"]["preloaded"] is False
    ckpts = [sorted((tmp_path / run / "checkpoints").glob("step_*"))[-1] for run in ("warm", "cold")]
    cmp = subprocess.run(
        [sys.executable, "-m", "training.compare", *map(str, ckpts)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cmp.returncode == 0 and "EQUAL" in cmp.stdout, cmp.stdout + cmp.stderr

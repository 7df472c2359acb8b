"""python -m training.batch_fit (issue 51, lever 5) measuring on a GPU: a tiny T5's peaks at two micro-batches give a
line that predicts a larger micro-batch's peak. Skipped without CUDA; choosing from measured figures and the
refusal on a CPU: tests/unit/training/test_batch_fit_choice.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT


def batch_fit(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.batch_fit", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda.max_memory_allocated)")
def test_on_a_gpu_a_tiny_t5_is_measured_and_its_line_predicts_a_larger_micro_batch(tmp_path):
    tiny = ["--model.d_model", "256", "--model.d_kv", "32", "--model.d_ff", "1024", "--model.num_layers", "4"]
    tiny += ["--model.num_decoder_layers", "4", "--data.seq_len", "256", "--train.global_batch", "64"]
    fit = tmp_path / "fit.json"
    r = batch_fit("--preset", "t5-large", "--nodes", "1", "--nproc-per-node", "1", "--probe", "4", "8",
                  "--out", str(fit), "--", *tiny, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    record = json.loads(fit.read_text())
    peaks = {int(m): gb for m, gb in record["peaks_gb"].items()}
    assert peaks[8] > peaks[4] > 0 and record["micro_batch"] == 64  # a tiny model: the whole share fits
    # the line from 4 and 8 predicts the measured peak at 16 within 10%
    check = tmp_path / "check.json"
    r = batch_fit("--preset", "t5-large", "--nodes", "1", "--nproc-per-node", "1", "--probe", "4", "16",
                  "--out", str(check), "--", *tiny, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    at_16 = json.loads(check.read_text())["peaks_gb"]["16"]
    assert record["fixed_gb"] + 16 * record["per_sample_gb"] == pytest.approx(at_16, rel=0.1)

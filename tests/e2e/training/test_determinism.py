"""Deterministic mode: the process settings it makes, and a whole kill-and-resume run under them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, STEP_3_COMMITTED, TINY_STEPS, tiny_run
from training.checkpoint import latest_complete, step_dir
from training.compare import compare

PROBE = """
import json, os, torch
from training.job.determinism import apply_determinism
apply_determinism({enabled})
print(json.dumps({{"algorithms": torch.are_deterministic_algorithms_enabled(),
                  "cudnn_deterministic": torch.backends.cudnn.deterministic,
                  "cudnn_benchmark": torch.backends.cudnn.benchmark,
                  "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                  # with deterministic algorithms torch fills new memory with NaN instead of leaving it as found
                  "empty_is_nan": bool(torch.empty(64).isnan().all())}}))
"""


def _settings(enabled: bool) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", PROBE.format(enabled=enabled)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_deterministic_mode_sets_what_reproducible_gpu_kernels_need_and_off_leaves_torch_defaults():
    assert _settings(True) == {
        "algorithms": True,
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "cublas": ":4096:8",
        "empty_is_nan": True,
    }
    off = _settings(False)
    assert (off["algorithms"], off["cudnn_deterministic"], off["cublas"]) == (False, False, None)


@pytest.mark.e2e
def test_a_killed_deterministic_run_resumes_bitwise_equal_to_the_reference(tiny_reference, tmp_path):
    r = tiny_run(
        tmp_path,
        2,
        *STEP_3_COMMITTED,
        "--parallel.deterministic",
        "true",
        "--fault.sigkill_at_step",
        "5",
        "--fault.rank",
        "1",
    )
    assert r.returncode != 0 and "SIGKILL" in r.stdout + r.stderr
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000003"
    r = tiny_run(tmp_path, 2, "--parallel.deterministic", "true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from step 3" in r.stdout
    # CPU kernels are deterministic either way: the mode changes no math, it only constrains kernel choice.
    assert (
        compare(step_dir(tiny_reference / "checkpoints", TINY_STEPS), step_dir(tmp_path / "checkpoints", TINY_STEPS))
        == []
    )

"""End to end: a plain `make train` (scripts/train.sh: one node, torchrun --standalone) survives a worker's death.

A worker SIGKILLs itself after a step (``--fault.sigkill_at_step``); the agent restarts the worker group, which
restores the newest in-memory snapshot, says in one line what that cost, and finishes in the same command with
final weights bitwise equal to the uninterrupted run's (tests/conftest.py tiny_reference; training.compare).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, TINY_STEPS
from training.compare import compare

pytestmark = pytest.mark.e2e
ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("NPROC", "NODES", "PRESET", "MAX_RESTARTS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
} | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STEPS = TINY_STEPS  # the shared uninterrupted run (tests/conftest.py tiny_reference: checkpoint every 3)


def train_sh(out: Path, *extra: str) -> subprocess.CompletedProcess:
    # the in-memory tier on (TINY turns it off for the storage tests): the restart restores from it
    argv = [
        "bash",
        "scripts/train.sh",
        *TINY,
        "--checkpoint.memory_interval",
        "1",
        "--job.out_dir",
        str(out),
        "--train.steps",
        str(STEPS),
        "--checkpoint.interval",
        "3",
        *extra,
    ]
    return subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)


def test_make_train_restarts_a_killed_worker_from_memory_and_finishes_bitwise(tiny_reference, tmp_path):
    # killed after step 5: its snapshot, or step 4's when the kill cut the copy short, is newer than the storage
    # checkpoint of step 3, so memory restores it (right after a storage step the newest could be that step's)
    got = train_sh(tmp_path / "run", "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    out = got.stdout + got.stderr
    assert got.returncode == 0, out[-4000:]
    assert "[fault] rank 1 SIGKILLs itself after step 5" in out
    line = re.search(
        r"\[recovery\] worker group restarted \(restart 1 of 3\): the previous attempt reached step "
        r"(\d+); state restored from memory at step (\d+) \((\d+) step\(s\) recomputed\); ([0-9.]+) s "
        r"from its last step to this attempt's step \d+",
        out,
    )
    assert line, out[-4000:]
    reached, restored, redone = (int(line.group(i)) for i in (1, 2, 3))
    assert reached == 5 and restored in (4, 5) and redone == reached - restored  # the snapshot of 5 or the one before
    assert "run 'make train' again" not in out and "ChildFailedError" not in out
    final = f"checkpoints/step_{STEPS:08d}"
    assert compare(tmp_path / "run" / final, tiny_reference / final, 0.0) == []
    print(f"\n{line.group(0)}")


def test_make_train_does_not_restart_a_worker_group_that_stopped_with_its_own_exit_code(tmp_path):
    """A diverged run (exit 5) would diverge again: the agent ends with its code after the first attempt."""
    got = train_sh(tmp_path / "run", "--fault.nan_at_step", "3")
    out = got.stdout + got.stderr
    assert got.returncode == 5, out[-4000:]
    assert out.count("non-finite loss nan") == 1 and "[recovery]" not in out, out[-4000:]
    assert "[agent] training stopped with exit code 5 (see the error above); the worker group is not restarted" in out

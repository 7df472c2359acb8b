"""A real start, phase by phase: the agent's spawn stamp reaches the worker (warm and compiled), the `start` event
holds every phase of training.job.startup.PHASES, the ledger lists each attempt's start-up. (A compiled restart
finding its node's compile cache: tests/e2e/training/test_compile_e2e.py; the shared artefacts:
tests/integration/training/test_compile_cache_artifacts.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY
from training.goodput.ledger import read_ledger
from training.job.startup import PHASES

pytestmark = pytest.mark.e2e
#: Synchronous saves: the checkpoint of step 2 has committed before the kill after step 3, on a loaded machine too.
STEP_2_COMMITTED = ("--checkpoint.async_save", "false")


def _agent(out, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """One agent, one worker, restarted once by its agent (the system's TMPDIR: the forkserver's socket path there
    must stay within AF_UNIX's 108 bytes, which a pytest tmp_path under an xdist worker exceeds)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch.agent",
            "--standalone",
            "--nproc_per_node=1",
            "--max-restarts",
            "1",
            "-m",
            "training",
            *TINY,
            "--job.out_dir",
            str(out),
            "--checkpoint.interval",
            "2",
            *args,
        ],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


def _starts(out) -> list[dict]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["event"] == "start"]


def test_a_killed_and_restarted_worker_records_its_start_by_phase_from_its_spawn(tmp_path):
    out = tmp_path / "run"
    r = _agent(out, "--train.steps", "5", "--fault.sigkill_at_step", "3", *STEP_2_COMMITTED)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    starts = _starts(out)
    assert [s["restart_count"] for s in starts] == [0, 1]
    for s in starts:
        su = s["startup"]
        assert su["preloaded"] is True and su["compiled"] is False
        # the agent stamped the spawn before the kernel started the process (10 ms /proc resolution)
        assert su["spawn_time"] is not None and su["began"] == su["spawn_time"] <= su["exec_time"] + 0.02
        assert all(su[f"{p}_s"] is not None and su[f"{p}_s"] >= 0 for p in PHASES)
        # the phases are the whole start: from the spawn to the start event, less the event's own write
        assert sum(su[f"{p}_s"] for p in PHASES) == pytest.approx(s["time"] - su["began"], abs=0.5)
    assert starts[1]["resumed_from"] == 2 and starts[1]["restored_from"]["tier"] == "storage"
    assert starts[1]["startup"]["restore_s"] > 0
    ledger = read_ledger(out)
    assert [(s.attempt, s.restart_count, s.compiled) for s in ledger.starts] == [(1, 0, False), (2, 1, False)]
    assert ledger.failures[0].startup == ledger.starts[1].phases
    assert ledger.starts[1].phases["compile"] == 0.0 and ledger.starts[1].total_s > 0

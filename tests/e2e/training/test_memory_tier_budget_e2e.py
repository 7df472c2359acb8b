"""memory_interval=auto end to end (torchrun, 2 ranks, gloo, CPU): the job says the interval it chose in its log
and records it (the snapshot_interval event, every step record), and a worker killed after step 5 resumes from
the newest snapshot auto took, bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import STEP_3_COMMITTED, TINY_STEPS, tiny_run
from training.checkpoint import latest_complete, step_dir
from training.compare import compare

pytestmark = pytest.mark.e2e
AUTO = ("--checkpoint.memory_interval", "auto")


@pytest.fixture(autouse=True)
def node_memory(tmp_path, monkeypatch) -> Path:
    shm = tmp_path / "shm"
    monkeypatch.setenv("T5F_MEMORY_DIR", str(shm))
    return shm


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_auto_says_its_interval_and_a_kill_resumes_bitwise_from_its_newest_snapshot(tiny_reference, tmp_path):
    out = tmp_path / "run"
    r = tiny_run(out, 2, *AUTO, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    [chosen] = [x for x in records(out) if x["event"] == "snapshot_interval"]  # steps 1-3 measure, 4 decides
    assert chosen["step"] == 4 and chosen["mode"] == "auto" and 1 <= chosen["interval"] <= 3  # checkpoint.interval
    assert chosen["detail"] in r.stdout and chosen["detail"].startswith("[checkpoint] in-memory snapshot every ")
    steps = {x["step"]: x["snapshot_interval"] for x in records(out) if x["event"] == "step"}
    assert [steps[s] for s in (1, 2, 3)] == [1, 1, 1] and steps[5] == chosen["interval"]
    assert latest_complete(out / "checkpoints").name == "step_00000003"
    r = tiny_run(out, 2, *AUTO)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = [x for x in records(out) if x["event"] == "start"][-1]["restored_from"]
    assert restored["tier"] == "memory" and restored["step"] >= 4, restored  # auto always snapshots step 4
    assert (
        compare(step_dir(tiny_reference / "checkpoints", TINY_STEPS), step_dir(out / "checkpoints", TINY_STEPS)) == []
    )

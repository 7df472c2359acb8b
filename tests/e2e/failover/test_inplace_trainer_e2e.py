"""In-process recovery in the real trainer (failover.in_place, docs/inprocess.md) going on at a smaller world: three
ranks of the tiny model (FSDP2 on gloo, CPU) forked by tests/support/inplace_trainer.py, which plays their agent
and only reports the lost rank gone (the project's agent would also start its replacement); rank 1 SIGKILLs itself
after step 2 (fault.sigkill_at_step). The survivors re-form at world 2 and re-cut their shards in memory. The
replacement, the bitwise result and the switched-off group restart go through the real launcher:
tests/e2e/failover/test_inplace_agent_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY
from training.checkpoint import latest_complete

pytestmark = pytest.mark.e2e
WORLD, STEPS, KILL_AFTER = 3, 5, 2


def run(out: Path, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    args = [*TINY, "--train.global_batch", str(2 * WORLD), "--train.steps", str(STEPS)]
    args += ["--checkpoint.interval", "100", "--checkpoint.memory_interval", "1", "--job.out_dir", str(out)]
    cmd = [sys.executable, "-m", "tests.support.inplace_trainer", "--dir", str(out), "--world", str(WORLD)]
    cmd += ["--report", "--", *args, *extra]
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    full_env["T5F_MEMORY_DIR"] = str(out / "shm")  # this run's own node memory
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


KILL = ("--fault.sigkill_at_step", str(KILL_AFTER), "--fault.rank", "1")


def test_survivors_allowed_a_smaller_world_go_on_without_the_lost_rank_their_shards_re_cut(etcd, tmp_path):
    """failover.in_place_min_world 2: nobody replaces the lost rank (its agent only reports it gone); the two
    survivors re-form at world 2 at once and restore the step every shard holds, re-cut from world 3 to 2 in
    memory, as the resharding restore does at a full restart."""
    env = etcd.add_job_user("inplace-shrink").as_env()
    out = tmp_path / "shrink"
    r = run(
        out,
        "--failover.in_place",
        "true",
        "--failover.in_place_min_world",
        "2",
        *KILL,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    agent = records(out / "agent.jsonl")
    assert len([e for e in agent if e["event"] == "start"]) == WORLD  # nobody was started for the lost rank
    assert sorted(e["rank"] for e in agent if e["event"] == "exit" and e.get("code") == 0) == [0, 2]
    metrics = records(out / "metrics.jsonl")
    (rec,) = [m for m in metrics if m["event"] == "in_place"]
    assert rec["world_size"] == 2 and len(rec["members"]) == 2 and rec["held_step"] == KILL_AFTER
    assert rec["restored_from"]["resharded_from"] == WORLD and rec["resumed_from"] in (KILL_AFTER - 1, KILL_AFTER)
    steps = [m for m in metrics if m["event"] == "step" and m["time"] > rec["time"]]
    killed_at = next(e["t"] for e in agent if e["event"] == "exit" and e.get("signal"))
    print(
        f"shrink to world 2: kill -> survivors' next step {steps[0]['time'] - killed_at:.2f} s (their recovery "
        f"{rec['seconds']:.2f} s: {rec['parts']})"
    )
    assert [m["step"] for m in steps] == list(range(rec["resumed_from"] + 1, STEPS + 1))
    assert {m["world_size"] for m in steps} == {2}
    assert [m["status"] for m in metrics if m["event"] == "end"] == ["finished"]
    final = latest_complete(str(out / "checkpoints"))
    assert final is not None and final.name.endswith(f"{STEPS:08d}")

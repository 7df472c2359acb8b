"""The survivors of an in-place recovery keep their live state (training.job.live_state) when the step they hold is
the one resumed, and restore when they must roll back; both through the real launcher (3 ranks of the tiny model,
one node, rank 1 SIGKILLed after step 2), both bitwise equal to an uninterrupted run.

* The kill waits for rank 1's snapshot of step 2 (``fault.sigkill_after_snapshot_at_step``): every shard of step 2
  is on the node, the survivors keep ranks 0 and 2 (the replacement takes rank 1), read nothing and copy their live
  shards (the ``in_place`` record's ``sources``: live, own, live); the replacement's restore still pairs up.
* The same with a synchronous save at step 2: storage holds the held step too, and the survivors still keep it.
* The kill lands halfway through that snapshot (``fault.kill_in_snapshot_at_step``): step 2 is not whole, every
  rank restores step 1 from its node (sources: own, own, own), the survivors rolling back one step; the workers
  start cold, so the survivors wait for the replacement longer than the peer heartbeat bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, torchrun
from training.checkpoint import latest_complete
from training.checkpoint.layout import MARKER, step_dir
from training.compare import compare

pytestmark = pytest.mark.e2e
WORLD, STEPS, KILL_AFTER = 3, 4, 2
ARGS = [*TINY, "--train.global_batch", str(2 * WORLD), "--train.steps", str(STEPS), "--checkpoint.interval", "100"]
ARGS += ["--checkpoint.memory_interval", "1"]
ENV = {k: v for k, v in os.environ.items() if k not in ("NPROC", "NODES", "PRESET", "MAX_RESTARTS", "SPARES")}
ENV |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    r = torchrun(WORLD, *ARGS, "--job.out_dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return latest_complete(str(out / "checkpoints"))


def recover_in_place(out: Path, fault: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    """Launch with failover.in_place and the fault on rank 1 after step 2; the run's one ``in_place`` record."""
    argv = [sys.executable, "-m", "training.launch", "--nodes", "1", "--nproc-per-node", str(WORLD), "--", *ARGS]
    argv += ["--job.out_dir", str(out), fault, str(KILL_AFTER), "--fault.rank", "1", "--failover.in_place", "true"]
    env = ENV | {"T5F_MEMORY_DIR": str(out / "shm")} | (env or {})
    r = subprocess.run([*argv, *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (rec,) = [m for m in metrics if m["event"] == "in_place"]
    assert sum(m["event"] == "start" for m in metrics) == 1, log[-4000:]  # rank 0 kept its process
    assert rec["held_step"] == KILL_AFTER and rec["world_size"] == WORLD
    steps = [m for m in metrics if m["event"] == "step"]
    killed_at = next(m["time"] for m in steps if m["step"] == KILL_AFTER)
    next_step = next(m["time"] for m in steps if m["time"] > killed_at) - killed_at
    print(
        f"{fault}: kill -> next step {next_step:.2f} s; recovery {rec['seconds']:.2f} s {rec['parts']}; "
        f"{rec['sources']}"
    )
    return rec


def test_survivors_holding_the_resumed_step_keep_their_live_state(tmp_path, reference):
    # a storage save at step 2 (in flight at the kill): the survivors' staging buffers exist, and are kept
    rec = recover_in_place(tmp_path, "--fault.sigkill_after_snapshot_at_step", "--checkpoint.interval", "2")
    assert rec["resumed_from"] == KILL_AFTER
    assert rec["sources"] == ["live", "own", "live"]  # the replacement (rank 1) reads its node's snapshot
    assert "keep" in rec["parts"]
    # rank 0's host buffers went to its new tiers: none made again by the restore's allocation for the next save
    assert rec["host_buffers"]["kept_bytes"] > 0 and rec["host_buffers"]["made"] == 0, rec["host_buffers"]
    assert compare(reference, latest_complete(str(tmp_path / "checkpoints"))) == []


def test_survivors_keep_their_state_when_storage_holds_the_same_step(tmp_path, reference):
    # a synchronous save at step 2 commits before the snapshot: storage holds the held step itself (a restart
    # would take storage on that tie; the survivors must not read back what they hold)
    sync_save = ("--checkpoint.interval", "2", "--checkpoint.async_save", "false")
    rec = recover_in_place(tmp_path, "--fault.sigkill_after_snapshot_at_step", *sync_save)
    assert (step_dir(tmp_path / "checkpoints", KILL_AFTER) / MARKER).is_file()  # storage held the held step: the tie
    assert rec["resumed_from"] == KILL_AFTER
    assert rec["sources"] == ["live", "own", "live"], rec  # storage x3 when a tie went to storage
    assert compare(reference, latest_complete(str(tmp_path / "checkpoints"))) == []


def test_survivors_that_must_roll_back_a_step_restore_it_and_outwait_a_cold_replacement(tmp_path, reference):
    # A cold replacement (torch imported again: 6-7 s here) starts after the peer heartbeat bound (5 s): the
    # survivors' old watchdog, still watching the dead rank, ended them into a group restart before it was closed
    # at the recovery's start. The recovery's own bound is raised to outwait it on a loaded host.
    cold = {"T5_WARM_WORKERS": "0"}
    bounds = ("--failover.in_place_bound_s", "40", "--parallel.heartbeat_timeout_s", "3")
    rec = recover_in_place(tmp_path, "--fault.kill_in_snapshot_at_step", *bounds, env=cold)
    assert rec["resumed_from"] == KILL_AFTER - 1
    assert rec["sources"] == ["own", "own", "own"]
    assert compare(reference, latest_complete(str(tmp_path / "checkpoints"))) == []

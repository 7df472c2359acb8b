"""In-memory snapshots end to end (torchrun, gloo, CPU): a worker kill, a kill in the middle of a copy, a lost
node (its shards from the peer's replica) and two adjacent lost nodes (storage), each compared bitwise with
an uninterrupted run. Every test shows its fault happened and where the restore came from (the `start`
event's restored_from), so none of them would pass on a run without its fault."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, STEP_3_COMMITTED, TINY, TINY_STEPS, tiny_run
from training.checkpoint import latest_complete, step_dir
from training.compare import compare

pytestmark = pytest.mark.e2e
STEPS = TINY_STEPS
MEMORY = ("--checkpoint.memory_interval", "1")


@pytest.fixture(autouse=True)
def node_memory(tmp_path, monkeypatch) -> Path:
    """This test's own 'node memory' (the jobs' T5F_MEMORY_DIR), instead of the machine's /dev/shm."""
    shm = tmp_path / "shm"
    monkeypatch.setenv("T5F_MEMORY_DIR", str(shm))
    return shm


def starts(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "start"]


def snapshot_files(shm: Path) -> list[str]:
    return sorted(str(p.relative_to(shm)) for p in shm.rglob("*") if p.is_file()) if shm.exists() else []


def launch(out: Path, nodes: int, *extra: str, global_batch: int = 4) -> subprocess.CompletedProcess:
    """`nodes` simulated nodes x 1 process (python -m training.launch), each node with its own memory dir."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            str(nodes),
            "--min-nodes",
            str(nodes),
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            "--",
            *TINY,
            "--train.global_batch",
            str(global_batch),
            "--job.out_dir",
            str(out),
            "--train.steps",
            str(STEPS),
            "--checkpoint.interval",
            "3",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_worker_kill_restores_from_its_nodes_memory(tiny_reference, tmp_path, node_memory):
    out = tmp_path / "run"
    r = tiny_run(out, 2, *MEMORY, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    assert latest_complete(out / "checkpoints").name == "step_00000003"  # storage alone would redo 4 and 5
    r = tiny_run(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = starts(out)[-1]["restored_from"]
    assert restored["tier"] == "memory" and restored["step"] >= 4, restored  # at most step 5 is recomputed
    assert f"restored step {restored['step']} from memory (every rank from its own node)" in r.stdout
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []
    assert snapshot_files(node_memory) == []  # a finished run leaves no memory behind


def test_kill_in_the_middle_of_a_copy_uses_the_previous_snapshot(tiny_reference, tmp_path, node_memory):
    out = tmp_path / "run"
    r = tiny_run(out, 2, *MEMORY, "--fault.kill_in_snapshot_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "halfway through the memory snapshot of step 5" in r.stdout
    (run_dir,) = node_memory.iterdir()
    # rank 1's step-5 generation was being written: its metadata is gone, so only step 4 is offered
    assert not any(step == 5 for step in _steps(run_dir, "own-r1-w2")) and 4 in _steps(run_dir, "own-r1-w2")
    r = tiny_run(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert starts(out)[-1]["restored_from"]["tier"] == "memory" and starts(out)[-1]["restored_from"]["step"] == 4
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []


def _steps(run_dir: Path, prefix: str) -> list[int]:
    import torch

    return [torch.load(p, weights_only=True)["step"] for p in run_dir.glob(f"{prefix}.*.meta")]


def test_a_lost_node_restores_its_shards_from_the_peer_replica(tiny_reference, tmp_path, node_memory):
    out = tmp_path / "run"
    r = launch(out, 2, *MEMORY, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    assert any(f.startswith("node0/") and "/peer-r1-w2." in f for f in snapshot_files(node_memory))
    shutil.rmtree(node_memory / "node1")  # node 1 is gone, and its memory with it
    r = launch(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = starts(out)[-1]["restored_from"]
    assert restored["tier"] == "peer" and restored["step"] >= 4, restored
    assert "shards of lost nodes from their peers' replicas" in r.stdout
    # two simulated nodes x 1 rank = the same world of 2 as the reference: bitwise equal
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []


def test_a_damaged_own_snapshot_is_skipped_for_the_peer_replica(tiny_reference, tmp_path, node_memory):
    from chaos.local.scenarios import damage_generations

    out = tmp_path / "run"
    r = launch(out, 2, *MEMORY, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    # every own copy of rank 1 (whichever step its replica also holds), 64 bytes each, as failing memory would
    damaged = damage_generations(node_memory / "node1", "own-r1-w2")
    assert damaged and all(d["now"] != d["crc32c"] for d in damaged)
    r = launch(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = starts(out)[-1]["restored_from"]
    assert restored["tier"] == "peer" and restored["step"] >= 4, restored
    newer = {("own", 1, d["step"]) for d in damaged if d["step"] > 3}  # the storage checkpoint: step 3
    assert {(d["copy"], d["rank"], d["step"]) for d in restored["skipped"]} == newer
    for d in restored["skipped"]:  # one line each: which copy, file, expected vs found
        assert (
            f"own-node copy of rank 1's shard of step {d['step']} (world size 2), {d['file']}: CRC32C expected "
            f"{d['expected']}, found {d['found']}"
        ) in r.stdout + r.stderr
    assert "damaged or lost shards from their peers' replicas" in r.stdout
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []
    moved = sorted(p.name for p in (node_memory / "node1").glob("*/quarantine/*/*.data"))
    assert len(moved) == len(newer)  # kept for inspection after the run finished


def test_a_damaged_own_snapshot_and_replica_fall_back_to_storage(tiny_reference, tmp_path, node_memory):
    from chaos.local.scenarios import damage_generations

    out = tmp_path / "run"
    r = launch(out, 2, *MEMORY, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0
    damaged = [
        d
        for node, kind in (("node1", "own"), ("node0", "peer"))
        for d in damage_generations(node_memory / node, f"{kind}-r1-w2")
    ]
    r = launch(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = starts(out)[-1]["restored_from"]
    assert restored["tier"] == "storage" and restored["step"] == 3, restored
    newer = {(Path(d["file"]).name.split("-r")[0], 1, d["step"]) for d in damaged if d["step"] > 3}
    assert {(d["copy"], d["rank"], d["step"]) for d in restored["skipped"]} == newer and {c for c, _, _ in newer} == {
        "own",
        "peer",
    }
    (line,) = [ln for ln in r.stdout.splitlines() if "memory snapshots not used" in ln]  # named in one line
    assert all(f"rank 1's {'own-node copy' if c == 'own' else 'peer replica'} of step {s}" in line for c, _, s in newer)
    assert "resumed from step 3" in r.stdout + r.stderr
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []


def test_damaged_snapshots_with_no_storage_checkpoint_start_over_and_say_so(tiny_reference, tmp_path, node_memory):
    from chaos.local.scenarios import damage_generations

    out = tmp_path / "run"
    r = launch(out, 2, *MEMORY, "--fault.sigkill_at_step", "2", "--fault.rank", "1")  # before step 3's checkpoint
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 2" in r.stdout
    assert latest_complete(out / "checkpoints") is None
    damaged = [
        d
        for node, kind in (("node1", "own"), ("node0", "peer"))
        for d in damage_generations(node_memory / node, f"{kind}-r1-w2")
    ]
    assert damaged
    r = launch(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert starts(out)[-1]["restored_from"] is None  # nothing damaged was loaded
    (line,) = [ln for ln in r.stdout.splitlines() if "memory snapshots not used" in ln]
    assert "no storage checkpoint is complete either: the run starts over from step 0" in line, line
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []


def test_two_adjacent_nodes_lost_fall_back_to_storage(tmp_path, node_memory):
    # the uninterrupted run of the same world (3 ranks): one standalone agent, no etcd nor 3 agents to start
    reference = tmp_path / "reference"
    r = tiny_run(reference, 3, "--train.global_batch", "6")
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "run"
    r = launch(out, 3, *MEMORY, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1", global_batch=6)
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    for node in ("node1", "node2"):  # rank 1's snapshot (node 1) and its replica (node 2) are both gone
        shutil.rmtree(node_memory / node)
    r = launch(out, 3, *MEMORY, global_batch=6)
    assert r.returncode == 0, r.stdout + r.stderr
    assert starts(out)[-1]["restored_from"] == {"tier": "storage", "step": 3}
    assert "no step complete for every shard (world size 3" in r.stdout
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []


def test_another_world_size_restores_from_memory_re_cut_to_its_shards(tmp_path, node_memory):
    # Expected: an uninterrupted 2-rank run's storage checkpoint of step 4, resumed at world 1 (DCP re-cuts it).
    expected = tmp_path / "expected"
    assert tiny_run(expected, 2, "--checkpoint.interval", "4").returncode == 0
    shutil.rmtree(step_dir(expected / "checkpoints", STEPS))
    r = tiny_run(expected, 1)
    assert r.returncode == 0 and "resumed from step 4" in r.stdout + r.stderr, r.stdout + r.stderr
    # The memory run: rank 1 dies copying step 5, so step 4 is the newest complete for both shards. Step 5 has no
    # storage save (at step 6 an async save started before the snapshot could commit first on some machines), and
    # the save of step 3 is synchronous (committed before the kill however loaded the machine).
    out = tmp_path / "run"
    r = tiny_run(out, 2, *MEMORY, *STEP_3_COMMITTED, "--fault.kill_in_snapshot_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "halfway through the memory snapshot of step 5" in r.stdout
    assert latest_complete(out / "checkpoints").name == "step_00000003"
    r = tiny_run(out, 1, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    restored = starts(out)[-1]["restored_from"]
    assert {k: restored[k] for k in ("tier", "step", "resharded_from")} == {
        "tier": "memory",
        "step": 4,
        "resharded_from": 2,
    }, restored
    assert "re-cut from world size 2 to 1" in r.stdout
    assert compare(step_dir(expected / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []
    assert snapshot_files(node_memory) == []  # the world-2 snapshots went with the re-cut, the rest at the end


def test_a_world_size_change_without_every_shard_in_memory_restores_from_storage(tmp_path, node_memory):
    out = tmp_path / "run"
    r = launch(
        out,
        2,
        *MEMORY,
        *STEP_3_COMMITTED,
        "--checkpoint.memory_replica",
        "false",
        "--fault.sigkill_at_step",
        "5",
        "--fault.rank",
        "1",
    )
    assert r.returncode != 0 and "[fault] rank 1 SIGKILLs itself after step 5" in r.stdout
    shutil.rmtree(node_memory / "node1")  # rank 1's shard was only on its node (no replica)
    r = launch(out, 1, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no step complete for every shard (world size 2" in r.stdout + r.stderr
    assert starts(out)[-1]["restored_from"] == {"tier": "storage", "step": 3}


def test_a_checkpoint_directory_emptied_for_a_fresh_start_never_gets_the_old_snapshots(tmp_path, node_memory):
    out = tmp_path / "run"
    r = tiny_run(out, 2, *MEMORY, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and snapshot_files(node_memory)  # the killed run's snapshots are still in memory
    shutil.rmtree(out / "checkpoints")  # the user starts over in the same directory, same settings
    r = tiny_run(out, 2, *MEMORY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert starts(out)[-1]["restored_from"] is None and "fresh start" in r.stdout


def test_a_diverged_run_leaves_no_snapshot_to_restore(tmp_path, node_memory):
    # nothing non-finite is ever restored: the storage checkpoints are the last good state, so the snapshots
    # taken since the bad step are removed with the run
    out = tmp_path / "run"
    r = tiny_run(out, 2, *MEMORY, "--fault.nan_at_step", "5")
    assert r.returncode == 5 and "non-finite loss nan" in r.stderr, r.stdout + r.stderr
    assert snapshot_files(node_memory) == []
    assert latest_complete(out / "checkpoints").name == "step_00000003"


def test_a_failed_snapshot_turns_the_tier_off_on_every_rank_and_training_goes_on(tiny_reference, tmp_path):
    # rank 1's copy fails; its peer (rank 0, replicating to it) must not wait for it: all ranks agree to stop
    # snapshotting at the next step, and the run finishes on storage checkpoints, bitwise as before
    out = tmp_path / "run"
    r = launch(out, 2, *MEMORY, "--fault.fail_snapshot_at_step", "4", "--fault.rank", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 1: in-memory snapshot failed (OSError: [Errno 28] [fault] injected" in r.stdout
    assert r.stdout.count("in-memory snapshots are off for this attempt") == 1
    steps = [x for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if x["event"] == "step"]
    assert [x["step"] for x in steps] == list(range(1, STEPS + 1))
    assert compare(step_dir(tiny_reference / "checkpoints", STEPS), step_dir(out / "checkpoints", STEPS)) == []

"""The in-memory snapshot tier in one process (a gloo world of 1): a snapshot restores the exact state, a
copy cut short is never offered, another run's or another model's snapshot is never loaded, a finished run
leaves nothing behind. The multi-process paths (peer replica, kills) are in test_memory_tier_e2e.py.

Here: the test that spawns a 2-rank gloo world (processes); the rest is in tests/unit/training/test_memory_tier.py."""

from __future__ import annotations

import torch

# Helpers this file shares with the unit tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_memory_tier import Plain


def two_node_tier(root: str, rank: int, **hooks):
    """The memory tier of one of two simulated nodes (one rank each) replicating to each other on CPU."""
    from pathlib import Path

    from training.checkpoint.memory import MemoryTier

    return MemoryTier(
        interval=1,
        root=Path(root) / f"node{rank}",
        rank=rank,
        world=2,
        local_world=1,
        identity={"model": "net"},
        replicate=True,
        timeout_s=60,
        device=torch.device("cpu"),
        **hooks,
    )


def _replica_worker(rank: int, root: str, store: str, damage_at: int, out: str) -> None:
    """One rank of a 2-node world (1 rank per node, each node its own memory directory): 3 snapshots, the
    replica of step `damage_at` damaged on rank 0 as it arrives (after the transfer, before the check)."""
    import json
    from pathlib import Path
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

    def damage(step, data):
        if step == damage_at:
            data[100:164] ^= 0xFF

    t = two_node_tier(root, rank, replica_hook=damage if rank == 0 else None)
    t.root.mkdir(parents=True)
    src = Plain(rank)
    for step in (1, 2, 3):
        src.train_step()
        t.snapshot(step, {"train": src})
        t.wait()
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "replicas": sorted(g[0] for g in t.peer.complete()),
                "failed": t.failed,
                "quarantined": sorted(p.name for p in (t.root / "quarantine").glob("*/*")) if rank == 0 else [],
            }
        )
    )
    dist.destroy_process_group()


def test_a_replica_damaged_on_the_way_is_caught_on_receipt_and_never_offered(tmp_path):
    import json
    import torch.multiprocessing as mp

    mp.spawn(_replica_worker, args=(str(tmp_path / "shm"), str(tmp_path / "store"), 3, str(tmp_path)), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["replicas"] == [2] and r1["replicas"] == [2, 3]  # rank 1's step-3 replica is not kept on node 0
    assert not r0["failed"] and not r1["failed"]  # the own snapshots are fine: the tier stays on
    assert r0["quarantined"] == ["DAMAGED.txt", "peer-r1-w2.0.data", "peer-r1-w2.0.meta"]

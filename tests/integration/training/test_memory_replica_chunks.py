"""The ring replica sent in chunks while the copy runs (training.checkpoint.memory, REPLICA_CHUNK), in a 2-rank gloo
world of two simulated nodes: the replica each node keeps is bitwise its peer's own copy, and a copy that fails
after the sizes were exchanged leaves the peer's previous replica current (no deadlock, nothing damaged offered)."""

from __future__ import annotations

import errno
import json

import torch

from tests.integration.training.test_memory_tier import two_node_tier
from tests.unit.training.test_snapshot_copy import Shards, shards


def _worker(rank: int, root: str, store: str, fail_at: int, out: str) -> None:
    """One rank of 2 nodes x 1 rank: small pieces and chunks (many of each), 3 snapshots; rank 1's copy of step
    `fail_at` fails halfway (the fault injection's hook), rank 0's copy of step 3 is slow halfway."""
    import time
    from pathlib import Path

    import torch.distributed as dist

    from training.checkpoint import memory
    from training.checkpoint.integrity import crc32c_file
    from training.checkpoint.snapshot_copy import PieceCopier

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    memory.REPLICA_CHUNK = 4096  # the snapshot is ~40 chunks

    def fail(step):
        if rank == 1 and step == fail_at:
            raise OSError(errno.ENOSPC, f"injected at step {step}")
        if rank == 0 and step == 3:  # a slow piece: the chunks after it must wait for it, not go out stale
            time.sleep(0.5)

    t = two_node_tier(root, rank, mid_copy_hook=fail)
    t.root.mkdir(parents=True)
    t.copier = PieceCopier(threads=2, piece_bytes=1000)
    for step in (1, 2, 3):
        t.snapshot(step, {"s": Shards(shards(10 * rank + step, rows=5000))})
        t.wait()
        own = t.own.find(step)
        peer = t.peer.find(step)
        Path(out, f"rank{rank}-step{step}.json").write_text(
            json.dumps(
                {
                    "own": own[1]["crc32c"] if own else None,
                    "own_file": crc32c_file(t.own.path(f"{t.own.current()['slot']}.data")) if own else None,
                    "peer": peer[1]["crc32c"] if peer else None,
                    "failed": t.failed,
                }
            )
        )
    own_bytes = {s: t.own.find(s)[2][: t.own.find(s)[1]["nbytes"]].clone() for s in (2, 3) if t.own.find(s)}
    peer_bytes = {s: t.peer.find(s)[2][: t.peer.find(s)[1]["nbytes"]].clone() for s in (2, 3) if t.peer.find(s)}
    torch.save({"own": own_bytes, "peer": peer_bytes}, Path(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_the_replica_sent_in_chunks_is_the_peers_copy_bitwise_and_a_failed_copy_is_never_kept(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(str(tmp_path / "shm"), str(tmp_path / "store"), 2, str(tmp_path)), nprocs=2)
    rec = {(r, s): json.loads((tmp_path / f"rank{r}-step{s}.json").read_text()) for r in (0, 1) for s in (1, 2, 3)}
    for r in (0, 1):
        for s in (1, 3):  # every copy fine: each node holds the other's bytes, checksum as its owner's
            assert rec[(r, s)]["own"] == rec[(r, s)]["own_file"]
            assert rec[(r, s)]["peer"] == rec[(1 - r, s)]["own"] is not None
    assert rec[(1, 2)]["own"] is None and rec[(1, 2)]["failed"]  # rank 1's copy of step 2 failed: not published
    assert rec[(0, 2)]["peer"] is None and not rec[(0, 2)]["failed"]  # ... nor kept as node 0's replica
    assert rec[(1, 2)]["peer"] == rec[(0, 2)]["own"]  # the other direction went through
    b0, b1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(b0["peer"][3], b1["own"][3]) and torch.equal(b1["peer"][3], b0["own"][3])
    assert torch.equal(b1["peer"][2], b0["own"][2]) and 2 not in b0["peer"]


def _peer_dies_worker(rank: int, root: str, store: str, out: str) -> None:
    """Rank 1 (the other node) dies before its snapshot of step 2: rank 0's exchange of step 2 fails at its
    start, while rank 0's own copy of the step runs."""
    import os
    from pathlib import Path

    import torch.distributed as dist

    from training.checkpoint import memory
    from training.checkpoint.snapshot_copy import PieceCopier

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    memory.REPLICA_CHUNK = 4096

    t = two_node_tier(root, rank)
    t.root.mkdir(parents=True)
    t.copier = PieceCopier(threads=2, piece_bytes=1000)
    for step in (1, 2):
        if rank == 1 and step == 2:
            os._exit(0)  # its sockets close: rank 0's exchange fails at once
        t.snapshot(step, {"s": Shards(shards(step, rows=5000))})
        t.wait()
    Path(out, "rank0.json").write_text(json.dumps({"own": sorted(g[0] for g in t.own.complete()), "failed": t.failed}))
    os._exit(0)  # no teardown with a dead peer


def test_a_peer_lost_during_the_exchange_costs_the_replica_not_this_nodes_own_snapshot(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_peer_dies_worker, args=(str(tmp_path / "shm"), str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got == {"own": [1, 2], "failed": True}  # the exchange failed (said), step 2's own copy is complete


def _peer_stays_worker(rank: int, root: str, store: str, out: str, lost: bool = False) -> None:
    """Rank 1 lives on but does not begin its snapshot of step 2 (in-place recovery: it left the old group at that
    step's boundary): rank 0's exchange of step 2 blocks. Its close with a bound returns at the bound (``lost``:
    at once, told the recovery lost rank 1, with a bound of 60 s); when rank 1 then takes step 2 after all and the
    blocked exchange goes through, rank 0's abandoned thread publishes nothing."""
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    from training.checkpoint import memory
    from training.checkpoint.snapshot_copy import PieceCopier

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    memory.REPLICA_CHUNK = 4096
    t = two_node_tier(root, rank)
    t.root.mkdir(parents=True)
    t.copier = PieceCopier(threads=2, piece_bytes=1000)
    t.snapshot(1, {"s": Shards(shards(1, rows=5000))})
    t.wait()
    closed = Path(out, "closed")
    if rank == 0:
        t.snapshot(2, {"s": Shards(shards(2, rows=5000))})
        thread = t._thread
        t0 = time.monotonic()
        t.close(discard=False, wait_s=60.0, lost_ranks=frozenset({1})) if lost else t.close(discard=False, wait_s=1.0)
        took = time.monotonic() - t0
        closed.touch()
        thread.join(30)  # rank 1's step 2 lets the exchange through
        result = {"took": took, "own": sorted(g[0] for g in t.own.complete()), "alive": thread.is_alive()}
        result["peer"] = sorted(g[0] for g in t.peer.complete())
        Path(out, "rank0.json").write_text(json.dumps(result))
    else:
        while not closed.exists():
            time.sleep(0.05)
        t.snapshot(2, {"s": Shards(shards(12, rows=5000))})
        t.wait()
    os._exit(0)  # rank 0's group may hold a half-used exchange: no teardown


def test_a_recovery_does_not_wait_for_a_snapshot_whose_exchange_is_blocked_and_never_publishes_it(tmp_path, caplog):
    import torch.multiprocessing as mp

    mp.spawn(_peer_stays_worker, args=(str(tmp_path / "shm"), str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert 1.0 <= got["took"] < 5.0, got  # the bound, not the group's timeout (60 s)
    assert not got["alive"], got  # the exchange did go through once rank 1 took its step 2...
    assert got["own"] == [1] and got["peer"] == [1], got  # ...and step 2 was published by neither side of it


def test_a_recovery_that_lost_the_exchange_partner_abandons_the_snapshot_in_flight_at_once(tmp_path, caplog):
    """The same blocked exchange, rank 0 told that the recovery lost rank 1 (its ring partner): it does not wait
    for the snapshot at all. (It waited the whole bound, 10 s, while a joiner's first collective on the new group
    timed out at 10 s: both ended, a full restart, in 1 of 6 runs of the node-kill-in-place e2e.)"""
    import torch.multiprocessing as mp

    mp.spawn(_peer_stays_worker, args=(str(tmp_path / "shm"), str(tmp_path / "store"), str(tmp_path), True), nprocs=2)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["took"] < 1.0, got  # at once, not the 60 s bound
    assert not got["alive"] and got["own"] == [1] and got["peer"] == [1], got

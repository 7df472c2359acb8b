"""The in-memory snapshot's host-side copy throughput, next to a plain memcpy of the same bytes (figures only).

A snapshot copies each rank's whole state into node-local shared memory (:mod:`training.checkpoint.memory`). How
fast that copy runs is judged against what the machine can do: one ``copy_`` of a buffer of the same size into a
reused buffer, run by every rank at the same time (the ranks of a node share its memory bus, as their snapshots
do). Both are timed between barriers, so the per-node figure is the node's bytes over the slowest rank's time, and
both report their best of REPEATS: on a machine shared with other work the least disturbed run is the one that
says what the copy itself costs, and the same rule for both keeps them comparable.

    figures = copy_figures(trainer, first_step=10_000)   # in training.bench's worker, every rank
    for line in report_lines(result): print(line)        # in its report
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

REPEATS = 5


def _timed_on_every_rank(fn) -> float:
    """Seconds `fn` takes, from a barrier until every rank is done (the slowest rank's time)."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def _local_world() -> int:
    import os

    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def copy_figures(trainer, first_step: int) -> dict[str, float]:
    """Every rank: snapshot (capture, copy, checksums) and memcpy throughput, per rank and per node."""
    mem = trainer.ckpt.memory
    if not mem.enabled:
        return {}
    snaps = []
    for i in range(REPEATS + 1):  # the first one may still fault pages in (both generations are written by now)

        def one(step=first_step + i):
            mem.snapshot(step, trainer.state)
            mem.wait()

        snaps.append(_timed_on_every_rank(one))
    nbytes = max(b.numel() for b in mem.own.bufs.values())
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(7)
    dst = torch.empty_like(src).fill_(0)  # faulted in once, like the snapshot's reused buffers
    copies = [_timed_on_every_rank(lambda: dst.copy_(src)) for _ in range(REPEATS)]
    snap_s, memcpy_s = min(snaps[1:]), min(copies)
    local = _local_world()
    return {
        "copy_bytes_per_rank": nbytes,
        "copy_snapshot_s": snap_s,
        "copy_memcpy_s": memcpy_s,
        "copy_snapshot_gbps_rank": nbytes / snap_s / 1e9,
        "copy_memcpy_gbps_rank": nbytes / memcpy_s / 1e9,
        "copy_snapshot_gbps_node": local * nbytes / snap_s / 1e9,
        "copy_memcpy_gbps_node": local * nbytes / memcpy_s / 1e9,
        "copy_threads": getattr(getattr(mem, "copier", None), "threads", 1),
        "copy_ranks_per_node": local,
    }


def report_lines(r: dict) -> list[str]:
    """e.g. ``t5-60m: snapshot copy 1.9 GB/s per rank, 3.8 GB/s per node (memcpy 6.1 GB/s, 12.2 GB/s) ...``."""
    if "copy_snapshot_gbps_rank" not in r:
        return []
    return [
        f"{r['preset']}: snapshot copy {r['copy_snapshot_gbps_rank']:.2f} GB/s per rank, "
        f"{r['copy_snapshot_gbps_node']:.2f} GB/s per node (memcpy of the same bytes {r['copy_memcpy_gbps_rank']:.2f}"
        f" GB/s per rank, {r['copy_memcpy_gbps_node']:.2f} GB/s per node): {r['copy_bytes_per_rank'] / 1e6:,.0f} MB "
        f"per rank in {r['copy_snapshot_s']:.3f} s (capture, copy, CRC32C; {r['copy_threads']} copy thread(s) per "
        f"rank, {r['copy_ranks_per_node']} rank(s) per node)"
    ]

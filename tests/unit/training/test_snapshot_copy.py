"""The snapshot copy in pieces on threads (training.checkpoint.snapshot_copy): the bytes and the CRC32C are those
of the one-thread copy; the reused host blocks follow the state's size; a snapshot taken through it restores
bitwise; a piece that fails fails the snapshot, never published."""

from __future__ import annotations

import errno

import pytest
import torch

from training.checkpoint.integrity import crc32c_bytes
from training.checkpoint.memory import _copy_checked, _layout, _views
from training.checkpoint.snapshot_copy import HostPieces, PieceCopier, Staged, fill_block, spans
from training.checkpoint.copy_plan import plan_pieces


def shards(seed: int, rows: int = 300) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(rows, 7, generator=g),  # several pieces
        torch.randn(5, 9, generator=g).t(),  # strided: copied whole
        torch.tensor(seed, dtype=torch.int64),  # 0-dim
        torch.randn(33, generator=g).to(torch.bfloat16),
        torch.randint(0, 255, (1000,), dtype=torch.uint8, generator=g),
    ]


def test_the_threads_copy_every_shard_and_their_checksum_is_the_single_thread_one():
    tensors = shards(0)
    layout, nbytes = _layout(tensors)
    copier = PieceCopier(threads=3, piece_bytes=1024)
    buf = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
    crc = copier.start(buf, copier.stage(tensors, layout, nbytes)).crc()
    copier.close()
    assert len(plan_pieces(spans(tensors, layout, on_host=True), nbytes, 1024)) > 5  # the threads shared pieces
    assert all(torch.equal(v, t) for v, t in zip(_views(buf, layout), tensors))
    single = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
    assert crc == crc32c_bytes(buf) == _copy_checked(single, layout, nbytes, tensors)
    assert torch.equal(buf, single)


def staged_through_host_blocks(host: HostPieces, tensors, piece_bytes: int) -> tuple[Staged, list, int]:
    """The GPU path's logic on the CPU: every piece through its reused host block (what the side stream fills)."""
    layout, nbytes = _layout(tensors)
    pieces = plan_pieces(spans(tensors, layout, on_host=False), nbytes, piece_bytes)
    sources = [t.contiguous() for t in tensors]
    blocks = host.fit([p.end - p.start for p in pieces])
    for p, b in zip(pieces, blocks):
        fill_block(p, b, sources)
    return Staged(pieces, sources, blocks, events=None), layout, nbytes


def test_host_blocks_are_reused_for_the_same_state_and_made_anew_when_the_state_changes_size():
    host, copier = HostPieces(pin=False), PieceCopier(threads=2, piece_bytes=1024)
    for rows, seed in ((300, 0), (300, 1), (500, 2), (40, 3)):  # same size twice, then grown, then shrunk
        made = host.allocations
        tensors = shards(seed, rows)
        staged, layout, nbytes = staged_through_host_blocks(host, tensors, 1024)
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        crc = copier.start(buf, staged).crc()
        assert all(torch.equal(v, t) for v, t in zip(_views(buf, layout), tensors)), rows
        assert crc == crc32c_bytes(buf)
        assert [b.numel() for b in host.blocks] == [p.end - p.start for p in staged.pieces]
        assert (host.allocations == made) == (seed == 1)  # only the same-size state reused its blocks
    copier.close()


def test_host_blocks_handed_over_are_the_same_memory_and_the_old_holder_keeps_none():
    host = HostPieces(pin=False)
    blocks = host.fit([1024, 1024, 512])
    kept = host.hand_over()
    assert host.blocks == [] and host.nbytes == 0 and kept.nbytes == 2560
    again = kept.fit([1024, 1024, 512])
    assert [b.data_ptr() for b in again] == [b.data_ptr() for b in blocks] and kept.allocations == 0


# ----------------------------------------------------------------------------- through the tier
pytestmark = pytest.mark.usefixtures("world_of_one")


def tier(root, **kw):
    from training.checkpoint.memory import MemoryTier

    return MemoryTier(
        interval=1,
        root=root,
        rank=0,
        world=1,
        local_world=1,
        identity={"model": "net"},
        replicate=False,
        timeout_s=60,
        device=torch.device("cpu"),
        **kw,
    )


class Shards:
    """A Stateful holding `shards` (a strided one among them)."""

    def __init__(self, tensors):
        self.tensors = tensors

    def state_dict(self):
        return {f"t{i}": t for i, t in enumerate(self.tensors)}

    def load_state_dict(self, sd):
        self.tensors = [sd[f"t{i}"] for i in range(len(self.tensors))]


def test_a_snapshot_copied_by_threads_in_small_pieces_restores_bitwise(tmp_path):
    t = tier(tmp_path)
    t.copier = PieceCopier(threads=3, piece_bytes=512)
    src = Shards(shards(0, rows=2000))
    t.snapshot(1, {"s": src})
    t.wait()
    assert not t.failed
    dst = Shards([torch.zeros_like(x) for x in shards(1, rows=2000)])
    got = tier(tmp_path).restore({"s": dst}, storage_step=0)
    assert got is not None and got.step == 1
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(src.tensors, dst.tensors))
    t.close(discard=True)


def test_a_piece_that_fails_mid_copy_fails_the_snapshot_and_it_is_never_published(tmp_path):
    def no_room(step):
        raise OSError(errno.ENOSPC, f"injected at step {step}")

    t = tier(tmp_path, mid_copy_hook=no_room)
    t.copier = PieceCopier(threads=2, piece_bytes=512)
    t.snapshot(1, {"s": Shards(shards(0))})
    t.wait()
    assert t.failed and t.own.complete() == []
    t.close(discard=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_shards_go_through_reused_pinned_blocks_on_a_side_stream_and_land_bitwise():
    dev = torch.device("cuda")
    copier = PieceCopier(threads=3, piece_bytes=1024)
    for seed in (0, 1):  # the second snapshot of the same sizes reuses the pinned blocks
        tensors = [t.to(dev) for t in shards(seed)[:2]] + shards(seed)[2:]  # a strided GPU shard, CPU ones
        layout, nbytes = _layout(tensors)
        made = copier.host.allocations
        staged = copier.stage(tensors, layout, nbytes)
        assert staged.events is not None and len(staged.events) == len(staged.pieces) > 5
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        crc = copier.start(buf, staged).crc()
        assert all(torch.equal(v, t.cpu()) for v, t in zip(_views(buf, layout), tensors))
        assert crc == crc32c_bytes(buf) and all(b.is_pinned() for b in copier.host.blocks)
        assert (copier.host.allocations == made) == (seed == 1)
    copier.close()

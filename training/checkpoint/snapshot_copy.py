"""The snapshot copy: a state's shards into the snapshot's buffer in pieces, on a few threads, each piece checksummed
as it lands; on GPUs the device-to-host part first, on a side stream into reused page-locked pieces.

:mod:`training.checkpoint.copy_plan` cuts the flat layout into pieces; this module runs them. Every piece is one
task on a small thread pool (torch's ``copy_`` and :func:`training.checkpoint.fast_crc.extend` release the GIL,
so the threads copy in parallel and leave the training thread its interpreter); its CRC32C is computed right
behind its copy, while its bytes are still in cache, and the pieces' CRCs are combined in order into the one
the snapshot's metadata keeps.

GPU shards: :meth:`PieceCopier.stage` (on the training thread) queues each piece's device-to-host copies on a
side stream after the work queued so far (this step's optimizer update) into that piece's page-locked host
block, and records an event per piece; the training stream never waits. The thread's task for a piece waits
for its event alone, so the first pieces are written to shared memory (and sent to the peer) while later ones
are still crossing the bus. The host blocks are allocated once and kept (:class:`HostPieces`): pinning memory
costs seconds for a large model, every later snapshot reuses it; a new state size makes new blocks.

    copier = PieceCopier(threads=4)
    staged = copier.stage(tensors, layout, nbytes)       # training thread: queues GPU copies, returns at once
    copy = copier.start(buf, staged)                     # snapshot thread: the pieces run on the pool
    crc = copy.crc()                                     # waits for every piece; the whole buffer's CRC32C
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import torch

from training.checkpoint.copy_plan import Piece, pieces_before, plan_pieces
from training.checkpoint.fast_crc import combine_all, extend, hexdigest

# A piece of the copy: large enough that a task's Python is noise next to its copy, small enough that its bytes
# are still in the CPU's cache when its checksum reads them, and that the pool's threads share the work evenly.
PIECE_BYTES = 4 << 20


class HostPieces:
    """Page-locked host blocks, one per piece of a GPU snapshot, kept from one snapshot to the next.

    Reused only while the pieces have the same sizes: a state of another size (a new world size, another
    optimizer) gets new blocks, never a block too small or cut for another layout."""

    def __init__(self, pin: bool = True):
        self.pin = pin
        self.blocks: list[torch.Tensor] = []
        self.allocations = 0  # blocks made so far (a reused set makes none)

    def hand_over(self) -> "HostPieces":
        """Holders of the same blocks for the next memory tier (training.checkpoint.host_buffers); these keep none."""
        kept = HostPieces(pin=self.pin)
        kept.blocks, self.blocks = self.blocks, []
        return kept

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.blocks)

    def fit(self, sizes: list[int]) -> list[torch.Tensor]:
        if [b.numel() for b in self.blocks] != sizes:
            self.blocks = [torch.empty(n, dtype=torch.uint8, pin_memory=self.pin) for n in sizes]
            self.allocations += len(sizes)
        return self.blocks


@dataclass
class Staged:
    """What the snapshot thread copies: the pieces, and either the shards themselves (CPU) or the host blocks the
    side stream fills with each piece's event (GPU)."""

    pieces: list[Piece]
    sources: list[torch.Tensor]
    blocks: list[torch.Tensor] | None = None
    events: list[Any] | None = None


class Copy:
    """The pieces of one snapshot in flight on the pool."""

    def __init__(self, pieces: list[Piece], futures: list[Future]):
        self.pieces, self.futures = pieces, futures

    def wait_through(self, end: int) -> None:
        """Until every byte before `end` is copied (or its piece failed: :meth:`crc` reports that)."""
        for f in self.futures[: pieces_before(self.pieces, end)]:
            f.exception()

    def crc(self) -> str:
        """The CRC32C of the whole buffer, once every piece is copied; a piece's error is raised here (after every
        piece has ended: none may still write into the buffer once the snapshot thread is done)."""
        self.wait_through(self.pieces[-1].end if self.pieces else 0)
        return hexdigest(combine_all([(f.result(), p.end - p.start) for p, f in zip(self.pieces, self.futures)]))


def spans(tensors: list[torch.Tensor], layout: list[tuple[int, str, list[int]]], on_host: bool) -> list:
    """(offset, bytes, splittable) per shard. `on_host`: the bytes are copied from these tensors by the CPU, which
    can cut only a contiguous CPU tensor; the GPU path stages every shard contiguous first, so all are cut."""
    out = []
    for (off, _, _), t in zip(layout, tensors):
        cut = not on_host or (t.is_contiguous() and t.device.type == "cpu")
        out.append((off, t.numel() * t.element_size(), cut))
    return out


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _copy_segments(piece: Piece, dst: torch.Tensor, base: int, sources, before, non_blocking: bool = False) -> None:
    """Fill `dst` (the bytes of the piece, `base` being the piece's first byte's offset in dst's frame)."""
    for s in piece.segments:
        if before is not None and s.src == 0:
            before(s.index)
        src = sources[s.index].detach()
        region = dst[s.dst - base : s.dst - base + s.nbytes]
        if s.whole:  # strided: copied element by element into its place
            region.view(src.dtype).view(src.shape).copy_(src)
        else:
            region.copy_(_bytes_of(src)[s.src : s.src + s.nbytes], non_blocking=non_blocking)


def fill_block(piece: Piece, block: torch.Tensor, sources, non_blocking: bool = False) -> None:
    """Queue (GPU) or do (CPU) the copies of a piece's segments into its host block (block byte 0 = piece.start)."""
    _copy_segments(piece, block, piece.start, sources, None, non_blocking=non_blocking)


def _cpu_piece(buf: torch.Tensor, piece: Piece, sources, before) -> int:
    _copy_segments(piece, buf, 0, sources, before)
    return extend(0, buf[piece.start : piece.end])


def copy_on_this_thread(buf: torch.Tensor, staged: Staged, before: Callable[[int], None] | None = None) -> str:
    """The copy without a pool (CPU shards): every piece in order; the whole buffer's CRC32C."""
    crcs = [(_cpu_piece(buf, p, staged.sources, before), p.end - p.start) for p in staged.pieces]
    return hexdigest(combine_all(crcs))


def _staged_piece(buf: torch.Tensor, piece: Piece, block: torch.Tensor, event, before) -> int:
    if before is not None:
        for s in piece.segments:
            if s.src == 0:
                before(s.index)
    if event is not None:
        event.synchronize()  # this piece's device-to-host copies have landed in its block
    region = buf[piece.start : piece.end]
    region.copy_(block[: region.numel()])
    return extend(0, region)


class PieceCopier:
    """Runs snapshot copies on a pool of `threads` (made at the first copy, so a forked worker makes its own)."""

    def __init__(self, threads: int, piece_bytes: int = PIECE_BYTES, host: HostPieces | None = None):
        self.threads, self.piece_bytes = max(1, threads), piece_bytes
        self._pool: ThreadPoolExecutor | None = None
        self.host = host or HostPieces()  # kept across an in-place recovery (training.checkpoint.host_buffers)
        self._stream = None
        self._planned: tuple[Any, list[Piece]] | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="memory-copy")
        return self._pool

    def stage(self, tensors: list[torch.Tensor], layout, nbytes: int) -> Staged:
        """On the training thread. CPU shards: only the plan. GPU shards: their copies queued on the side stream."""
        if not any(t.is_cuda for t in tensors):
            return Staged(self._plan(spans(tensors, layout, on_host=True), nbytes), tensors)
        device = next(t.device for t in tensors if t.is_cuda)
        sources = [t.detach() if t.is_contiguous() else t.detach().contiguous() for t in tensors]
        pieces = self._plan(spans(sources, layout, on_host=False), nbytes)
        blocks = self.host.fit([p.end - p.start for p in pieces])
        self._stream = self._stream or torch.cuda.Stream(device=device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        events = []
        with torch.cuda.stream(self._stream):
            for p, block in zip(pieces, blocks):
                fill_block(p, block, sources, non_blocking=True)
                events.append(torch.cuda.Event())
                events[-1].record(self._stream)
        for s, t in zip(sources, tensors):
            if s.is_cuda and s.data_ptr() != t.data_ptr():
                s.record_stream(self._stream)  # a contiguous temporary: not reused before the side stream read it
        return Staged(pieces, sources, blocks, events)

    def _plan(self, shard_spans: list, nbytes: int) -> list[Piece]:
        """The pieces for these spans: the last plan again while the state keeps its layout (every snapshot of a
        run but the first: planning thousands of shards is milliseconds on the training thread)."""
        key = (nbytes, tuple(shard_spans))
        if self._planned is None or self._planned[0] != key:
            self._planned = (key, plan_pieces(shard_spans, nbytes, self.piece_bytes))
        return self._planned[1]

    def start(self, buf: torch.Tensor, staged: Staged, before: Callable[[int], None] | None = None) -> Copy:
        """On the snapshot thread: every piece submitted to the pool, in order."""
        if staged.blocks is None:
            futures = [self.pool.submit(_cpu_piece, buf, p, staged.sources, before) for p in staged.pieces]
        else:
            futures = [
                self.pool.submit(_staged_piece, buf, p, b, e, before)
                for p, b, e in zip(staged.pieces, staged.blocks, staged.events or [None] * len(staged.pieces))
            ]
        return Copy(staged.pieces, futures)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

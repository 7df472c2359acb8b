"""How a snapshot's bytes are cut into pieces for the copy threads, and how many threads copy. Pure arithmetic.

A snapshot is one flat byte layout (every shard at an aligned offset, :func:`training.checkpoint.memory._layout`).
The copy walks it in pieces of about ``piece_bytes``: a piece is a contiguous byte range of the destination,
made of segments (a byte range of one shard). A contiguous shard is cut at piece boundaries, so a large shard is
copied as several large chunks by several threads and many small shards share one piece; a strided shard (it has
no byte range) is copied whole, inside one piece. The pieces tile ``[0, nbytes)`` in order, the alignment padding
included, so a piece's CRC32C covers exactly its range and the pieces' CRCs combine into the whole snapshot's
(:mod:`training.checkpoint.fast_crc`).

The replica of a snapshot goes to the peer in chunks of fixed size (:func:`replica_chunks`), each sent as soon as
the pieces that cover it are copied: the receiver knows the chunks from the total size alone.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_COPY_THREADS = 4  # past a few threads the memory bus, not the threads, is the limit


@dataclass(frozen=True)
class Segment:
    """Bytes [src, src + nbytes) of shard `index` go to [dst, dst + nbytes) of the snapshot; `whole`: the shard is
    strided (or not on the CPU) and is copied whole (then src is 0 and nbytes its size)."""

    index: int
    src: int
    dst: int
    nbytes: int
    whole: bool = False


@dataclass(frozen=True)
class Piece:
    """A contiguous byte range [start, end) of the snapshot and the segments that fill it (padding not copied)."""

    start: int
    end: int
    segments: tuple[Segment, ...]


def plan_pieces(spans: list[tuple[int, int, bool]], nbytes: int, piece_bytes: int) -> list[Piece]:
    """Pieces over `spans` ((offset, size in bytes, splittable) per shard, in layout order) tiling [0, nbytes).

    A piece closes once it holds `piece_bytes` or more; a splittable shard is cut exactly there."""
    if piece_bytes <= 0:
        raise ValueError(f"piece_bytes={piece_bytes} must be positive")
    pieces: list[Piece] = []
    start, segs = 0, []
    for i, (off, size, splittable) in enumerate(spans):
        pos = 0
        while pos < size:
            if segs and off + pos - start >= piece_bytes:  # the padding before this shard filled the piece
                pieces.append(Piece(start, off + pos, tuple(segs)))
                start, segs = off + pos, []
            take = min(size - pos, start + piece_bytes - (off + pos)) if splittable else size
            segs.append(Segment(i, pos, off + pos, take, whole=not splittable))
            pos += take
            if off + pos - start >= piece_bytes:
                pieces.append(Piece(start, off + pos, tuple(segs)))
                start, segs = off + pos, []
    if segs or start < nbytes:
        pieces.append(Piece(start, nbytes, tuple(segs)))
    return pieces


def replica_chunks(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges the replica of an `nbytes` snapshot is sent in (sender and receiver compute the same)."""
    return [(a, min(a + chunk_bytes, nbytes)) for a in range(0, nbytes, chunk_bytes)]


def pieces_before(pieces: list[Piece], end: int) -> int:
    """How many pieces (from the first) must be copied before bytes [.., end) are all in place."""
    n = 0
    while n < len(pieces) and pieces[n].start < end:
        n += 1
    return n


def copy_threads(cpus: int, local_world: int) -> int:
    """Copy threads per rank: this rank's share of the node's cores, at least 1, at most MAX_COPY_THREADS."""
    return max(1, min(MAX_COPY_THREADS, cpus // max(1, local_world)))

"""How a snapshot is cut into pieces for the copy threads (training.checkpoint.copy_plan): pure arithmetic."""

from __future__ import annotations

import pytest

from training.checkpoint.copy_plan import copy_threads, pieces_before, plan_pieces, replica_chunks

ALIGN = 64


def layout(sizes: list[int], strided: set[int] = frozenset()) -> tuple[list[tuple[int, int, bool]], int]:
    spans, off = [], 0
    for i, n in enumerate(sizes):
        spans.append((off, n, i not in strided))
        off += -(-n // ALIGN) * ALIGN
    return spans, off


@pytest.mark.parametrize(
    "sizes, strided, piece",
    [
        ([10_000], set(), 1024),  # one large shard: cut into pieces
        ([8] * 300, set(), 1024),  # many small shards: several share a piece
        ([100, 5000, 0, 3, 70_000, 1], {1}, 4096),  # a strided shard is copied whole
        ([4096, 4096, 4096], set(), 4096),  # boundaries on shard ends
        ([], set(), 64),
    ],
)
def test_pieces_tile_the_snapshot_and_copy_every_byte_once(sizes, strided, piece):
    spans, nbytes = layout(sizes, strided)
    pieces = plan_pieces(spans, nbytes, piece)
    assert [p.start for p in pieces[1:]] == [p.end for p in pieces[:-1]]  # contiguous, in order
    assert (pieces[0].start, pieces[-1].end) == (0, nbytes) if pieces else nbytes == 0
    covered: dict[int, list[tuple[int, int]]] = {}
    for p in pieces:
        for s in p.segments:
            assert p.start <= s.dst and s.dst + s.nbytes <= p.end  # a segment lies in its piece
            assert s.dst == spans[s.index][0] + s.src  # at its place in the layout
            covered.setdefault(s.index, []).append((s.src, s.nbytes))
            assert s.whole == (s.index in strided)
        if not any(s.whole for s in p.segments):
            assert p.end - p.start <= piece + ALIGN  # at most a piece (and the padding that closes it)
    for i, n in enumerate(sizes):
        parts = sorted(covered.get(i, []))
        assert sum(k for _, k in parts) == n and all(a + k == b for (a, k), (b, _) in zip(parts, parts[1:]))


def test_a_large_shard_is_several_pieces_and_small_shards_share_one():
    spans, nbytes = layout([10_000])
    assert len(plan_pieces(spans, nbytes, 1024)) == 10
    spans, nbytes = layout([8] * 300)  # 300 shards of 64 aligned bytes = 19,200 bytes
    assert len(plan_pieces(spans, nbytes, 1024)) == 19


def test_the_replica_chunks_and_the_pieces_each_chunk_waits_for():
    assert replica_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)] and replica_chunks(0, 4) == []
    spans, nbytes = layout([4096 * 4])
    pieces = plan_pieces(spans, nbytes, 4096)
    assert [pieces_before(pieces, end) for end in (1, 4096, 4097, 8192, nbytes)] == [1, 1, 2, 2, 4]


def test_copy_threads_are_a_share_of_the_node_at_most_a_few():
    assert [copy_threads(2, 2), copy_threads(2, 1), copy_threads(96, 8), copy_threads(192, 1)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="piece_bytes=0"):
        plan_pieces([], 0, 0)

"""The in-memory restore decision (training.checkpoint.restore_plan), case by case, with no files or processes:
which step every rank restores, which copy of each shard, and when storage wins."""

from __future__ import annotations

from training.checkpoint.restore_plan import restores_from_memory, same_world_sources, search_snapshots


def own(rank: int, world: int, *steps: int) -> list[tuple[int, int, int, str]]:
    return [(rank, world, s, "own") for s in steps]


def replica(rank: int, world: int, *steps: int) -> list[tuple[int, int, int, str]]:
    return [(rank, world, s, "peer") for s in steps]


def damaged(rank: int, world: int, step: int, copy: str) -> dict:
    return {"rank": rank, "world": world, "step": step, "copy": copy}


def ring(world: int, *steps: int) -> list[tuple]:
    """A healthy job, one rank a node: each node has its own shard and the previous node's replica."""
    return [(f"n{r}", own(r, world, *steps) + replica((r - 1) % world, world, *steps), []) for r in range(world)]


def test_the_newest_step_every_rank_holds_is_restored_each_from_its_own_node():
    search = search_snapshots(ring(2, 6, 7), world=2)
    assert search.chosen == (7, 2) and search.skipped == []
    assert same_world_sources(search.holders, world=2, step=7) == {0: (0, "own"), 1: (1, "own")}
    assert restores_from_memory(search, storage_step=5)


def test_a_lost_nodes_shard_comes_from_its_replica_on_the_next_node():
    # node n1 was replaced: its successor starts empty; n0 keeps rank 1's replica (the ring's previous node)
    gathered = [("n0", own(0, 2, 6, 7) + replica(1, 2, 6, 7), []), ("n1-new", [], [])]
    search = search_snapshots(gathered, world=2)
    assert search.chosen == (7, 2)
    assert same_world_sources(search.holders, world=2, step=7) == {0: (0, "own"), 1: (0, "peer")}


def test_a_step_missing_one_shard_gives_way_to_the_older_step_every_shard_has():
    gathered = [("n0", own(0, 2, 6, 7), []), ("n1", own(1, 2, 6), [])]  # rank 1 died copying step 7
    assert search_snapshots(gathered, world=2).chosen == (6, 2)


def test_a_damaged_own_copy_is_skipped_for_the_peers_replica_and_named():
    bad = damaged(1, 2, 7, "own")
    gathered = [("n0", own(0, 2, 7) + replica(1, 2, 7), []), ("n1", own(1, 2, 7) + replica(0, 2, 7), [bad])]
    search = search_snapshots(gathered, world=2)
    assert search.chosen == (7, 2) and search.skipped == [bad]
    assert same_world_sources(search.holders, world=2, step=7) == {0: (0, "own"), 1: (0, "peer")}


def test_when_both_copies_of_a_shard_are_damaged_the_older_step_is_restored():
    gathered = ring(2, 6, 7)
    gathered[1][2].append(damaged(1, 2, 7, "own"))
    gathered[0][2].append(damaged(1, 2, 7, "peer"))
    search = search_snapshots(gathered, world=2)
    assert search.chosen == (6, 2) and len(search.skipped) == 2


def test_damage_named_by_one_rank_of_a_node_holds_for_every_rank_of_that_node():
    # two ranks on one node list the same files; rank 1 checked (and named) rank 0's copy of step 7
    files = own(0, 2, 6, 7) + own(1, 2, 6, 7)
    gathered = [("n0", files, []), ("n0", files, [damaged(0, 2, 7, "own")])]
    assert search_snapshots(gathered, world=2).chosen == (6, 2)


def test_at_one_step_the_snapshot_of_this_world_size_wins_and_a_newer_step_wins_over_the_world_size():
    gathered = [("n0", own(0, 2, 8) + own(0, 1, 8), []), ("n1", own(1, 2, 8), [])]
    assert search_snapshots(gathered, world=2).chosen == (8, 2)
    assert search_snapshots(gathered, world=1).chosen == (8, 1)
    newer_elsewhere = [("n0", own(0, 1, 9) + own(0, 2, 8), []), ("n1", own(1, 2, 8), [])]
    assert search_snapshots(newer_elsewhere, world=2).chosen == (9, 1)  # re-cut from world 1
    assert search_snapshots(newer_elsewhere, world=2).worlds == [1, 2]


def test_storage_wins_when_it_holds_the_same_step_or_a_newer_one():
    search = search_snapshots(ring(2, 7), world=2)
    assert restores_from_memory(search, storage_step=6)
    assert not restores_from_memory(search, storage_step=7)
    assert not restores_from_memory(search, storage_step=9)


def test_a_tie_with_storage_goes_to_memory_only_where_survivors_hold_that_step_live():
    search = search_snapshots(ring(2, 7), world=2)
    assert restores_from_memory(search, storage_step=7, live_step=7)  # in place: the survivors keep step 7
    assert not restores_from_memory(search, storage_step=7, live_step=None)  # a restart: storage
    assert not restores_from_memory(search, storage_step=7, live_step=6)
    assert not restores_from_memory(search, storage_step=8, live_step=8)  # storage newer than any snapshot


def test_nothing_in_memory_is_a_restore_from_storage():
    search = search_snapshots([("n0", [], []), ("n1", [], [])], world=2)
    assert search.chosen is None and not restores_from_memory(search, storage_step=0)


def test_two_lost_nodes_of_three_restore_from_whatever_replicas_survive():
    # nodes n1 and n2 were replaced and came back empty but for the replicas their predecessors sent after
    gathered = [("n0", own(0, 3, 5) + replica(2, 3, 5), []), ("n1", replica(0, 3, 5), []), ("n2", replica(1, 3, 5), [])]
    search = search_snapshots(gathered, world=3)
    assert search.chosen == (5, 3)
    assert same_world_sources(search.holders, world=3, step=5) == {0: (0, "own"), 1: (2, "peer"), 2: (0, "peer")}
    gathered[2] = ("n2", [], [])  # shard 1 is nowhere now: storage
    assert search_snapshots(gathered, world=3).chosen is None

"""The agreement's rank order (training.job.inplace.agreement.in_rank_order): a replacement takes the rank of the
member it replaces, so the survivors' shards stay where they are (the trainer's fast path keeps their live state);
rank 0's included; when that cannot be (the world shrank under an old rank), the old order is kept compact."""

from training.job.inplace.agreement import CheckIn, in_rank_order


def entries(*members: tuple[str, int]) -> dict[str, CheckIn]:
    return {m: CheckIn(m, 4 if prev >= 0 else -1, prev, f"h:{m}") for m, prev in members}


def test_a_replacement_takes_the_rank_of_the_member_it_replaces():
    # r1 was killed; its replacement (id r00001-...) checks in as a joiner: ranks 0 and 2 keep theirs
    got = in_rank_order(entries(("r00000-h-10", 0), ("r00002-h-12", 2), ("r00001-h-99", -1)))
    assert got == ("r00000-h-10", "r00001-h-99", "r00002-h-12")


def test_two_replacements_fill_the_gaps_in_id_order():
    got = in_rank_order(entries(("a", 0), ("d", 3), ("r00002-x", -1), ("r00001-x", -1)))
    assert got == ("a", "r00001-x", "r00002-x", "d")


def test_rank_0_lost_its_replacement_takes_rank_0_and_the_survivors_keep_theirs():
    # rank 0's node lost, a spare's worker (id r00000-...) joins: the survivors' shards stay where they are
    assert in_rank_order(entries(("b", 1), ("c", 2), ("r00000-s-7", -1))) == ("r00000-s-7", "b", "c")
    # ranks 0 and 2 gone: the joiners fill both, in id order
    assert in_rank_order(entries(("b", 1), ("r00002-s-8", -1), ("r00000-s-7", -1))) == ("r00000-s-7", "b", "r00002-s-8")


def test_in_a_smaller_world_the_old_order_is_compacted_and_joiners_follow():
    # rank 0 gone and nobody in its place: the survivors close up
    assert in_rank_order(entries(("b", 1), ("c", 2))) == ("b", "c")
    # a shrink (no joiner yet): old rank 2 cannot keep its rank in a world of 2
    assert in_rank_order(entries(("a", 0), ("c", 2))) == ("a", "c")
    # the first epoch: only joiners, by id
    assert in_rank_order(entries(("r00001-h-2", -1), ("r00000-h-1", -1))) == ("r00000-h-1", "r00001-h-2")

"""The restore rule of the commit fence: a checkpoint written by a replaced worker group is never chosen."""

from training.checkpoint.stale_rule import stale_checkpoints


def test_a_checkpoint_newer_than_what_a_later_round_restored_is_stale():
    # round 1 committed 10 and 20; round 2 restored from 20; round 1, cut off, committed 30 unconfirmed
    stale = stale_checkpoints({10: 1, 20: 1, 30: 1}, {1: 0, 2: 20})
    assert set(stale) == {30}
    assert stale[30] == (
        "written by round 1 after round 2 had replaced it (round 2 restored from step 20, before step 30 existed)"
    )


def test_the_step_a_later_round_restored_from_is_not_stale():
    assert stale_checkpoints({20: 1}, {2: 20}) == {}


def test_checkpoints_of_the_newer_round_itself_are_not_stale():
    # round 2 restored from 20 and committed 30 and 40: its own, current
    assert stale_checkpoints({20: 1, 30: 2, 40: 2}, {1: 0, 2: 20}) == {}


def test_an_earlier_or_the_same_round_restoring_makes_nothing_stale():
    # round 3's checkpoint at 50 and round 3's own (or round 2's) restores from below it: not replaced
    assert stale_checkpoints({50: 3}, {2: 20, 3: 40}) == {}


def test_a_fresh_start_of_a_later_round_makes_every_older_rounds_checkpoint_stale():
    # round 2 found nothing complete and started over (0): anything of round 1 that appeared later is stale
    assert set(stale_checkpoints({10: 1, 20: 1}, {2: 0})) == {10, 20}


def test_the_earliest_replacing_round_is_named():
    stale = stale_checkpoints({30: 1}, {3: 10, 2: 20})
    assert "after round 2 had replaced it (round 2 restored from step 20" in stale[30]


def test_a_checkpoint_without_a_generation_is_never_stale():
    assert stale_checkpoints({30: None}, {2: 0, 3: 10}) == {}


def test_no_recorded_restores_make_nothing_stale():
    assert stale_checkpoints({10: 1, 20: 2}, {}) == {}


def test_a_replaced_round_stays_stale_after_more_rounds():
    # round 1's 30 (unconfirmed); round 2 restored 20 and committed 40; round 3 restored 40: round 1's 30 stays
    # stale (round 2's restore says so), while round 3 restoring above it changes nothing
    assert set(stale_checkpoints({30: 1, 40: 2}, {2: 20, 3: 40})) == {30}

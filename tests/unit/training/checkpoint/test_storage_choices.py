"""The storage tier's decisions on given facts: how long collectives wait, what a commit prunes, which unloadable
directories are quarantined or skipped, what checkpoint.load_step does, which state entries a checkpoint holds,
and whether a checkpoint may be resumed by this run."""

from training.checkpoint.run_identity import Change
from training.checkpoint.storage_choices import (
    SAVE_TIMEOUT_FACTOR,
    Rollback,
    Unloadable,
    collective_bound,
    identity,
    prune_victims,
    rollback,
    stored_entries,
    triage,
)


def test_collectives_wait_the_full_timeout_until_a_save_was_timed():
    assert collective_bound(0.0, 60, 3600) is None


def test_collectives_wait_a_multiple_of_the_slowest_save_within_their_floor_and_ceiling():
    assert collective_bound(1.0, 60, 3600) == 60  # the floor
    assert collective_bound(100.0, 60, 3600) == SAVE_TIMEOUT_FACTOR * 100.0  # the multiple
    assert collective_bound(5000.0, 60, 3600) == 3600  # the ceiling


def test_nothing_is_pruned_while_at_most_keep_last_are_complete():
    assert prune_victims([30, 20, 10], [40, 5], keep_last=3) == []


def test_a_commit_prunes_older_complete_and_older_unfinished_but_never_a_newer_unfinished_save():
    # complete 50, 40, 30, 20, 10 (newest first); unfinished: 45 (newer than the oldest kept) and 15, 5
    assert prune_victims([50, 40, 30, 20, 10], [45, 15, 5], keep_last=2) == [30, 20, 10, 15, 5]
    assert prune_victims([50, 40, 30], [45, 35], keep_last=2) == [30, 35]  # 45 is newer than the oldest kept, 40


def test_unloadable_directories_newer_than_the_newest_complete_are_quarantined_if_committed_else_skipped():
    bad = [
        Unloadable(40, committed=True, why="truncated"),
        Unloadable(30, committed=False, why="no commit marker"),
        Unloadable(10, committed=True, why="checksum"),  # older than the newest complete: no candidate, left alone
    ]
    found = triage(bad, newest_good=20)
    assert [b.step for b in found.quarantine] == [40] and [b.step for b in found.skip] == [30]


def test_with_no_complete_checkpoint_every_unloadable_one_is_sorted():
    found = triage([Unloadable(10, True, "x"), Unloadable(0, False, "y")], newest_good=None)
    assert [b.step for b in found.quarantine] == [10] and [b.step for b in found.skip] == [0]


def test_load_step_zero_asks_nothing():
    assert rollback(0, None, [30, 20]) is None


def test_load_step_moves_the_newer_complete_checkpoints_aside_once():
    assert rollback(20, None, [40, 30, 20, 10]) == Rollback(supersede=[40, 30])
    assert rollback(40, None, [40, 30]) == Rollback(supersede=[])  # already the newest: nothing to move
    assert rollback(20, 30, [40, 30, 20]) == Rollback(supersede=[40, 30])  # another step was applied before


def test_load_step_applied_by_an_earlier_start_resumes_from_the_newest_again():
    assert rollback(20, 20, [50, 20]) == Rollback(applied_before=True)
    assert rollback(20, 20, []) == Rollback(applied_before=True)  # decided before looking for the step


def test_load_step_without_a_complete_checkpoint_of_that_step_is_missing():
    assert rollback(25, None, [30, 20]) == Rollback(missing=True)


def test_only_the_entries_a_checkpoint_holds_are_loaded():
    stored = ["train.model.w", "train.optim.state", "rng_0", "rng_1"]
    assert stored_entries(["train", "rng_0", "rng_1", "rng_2"], stored) == {"train", "rng_0", "rng_1"}
    assert stored_entries(["tra", "rng_"], stored) == set()  # a prefix of a name is not the entry


def _change(field):
    return Change(field, 1, 2)


def test_another_model_is_never_resumed_whatever_the_settings():
    assert identity({"d": 256}, {"d": 512}, None, [], set()).other_model
    assert identity({"d": 256}, {"d": 512}, {"x": 1}, [_change("train.lr")], {"train.lr"}).other_model


def test_a_checkpoint_without_recorded_settings_is_resumed_unchecked():
    verdict = identity({"d": 1}, {"d": 1}, None, [_change("train.lr")], set())
    assert verdict.unrecorded and not verdict.refused and not verdict.accepted


def test_changed_settings_are_refused_unless_accepted():
    changes = [_change("train.lr"), _change("data.source")]
    refused = identity({}, {}, {"x": 1}, changes, {"train.lr"})
    assert [c.field for c in refused.refused] == ["data.source"] and refused.accepted == []
    ok = identity({}, {}, {"x": 1}, changes, {"train.lr", "data.source"})
    assert ok.refused == [] and [c.field for c in ok.accepted] == ["train.lr", "data.source"]
    same = identity({}, {}, {"x": 1}, [], set())
    assert not (same.other_model or same.unrecorded or same.refused or same.accepted)

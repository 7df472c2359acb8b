"""A closed rendezvous read by an agent re-forming its worker group: a participant of the job's newest formed round
learns the job stopped without its workers finishing (another node ended it on a failure: exit 1), where a hot spare
or a node a newer round replaced may have seen the job finish without it (exit 0). Found by `make chaos-test`'s
restarts-exhausted: the node whose workers were not killed said "hot spare: the job finished without needing this
node" and exited 0 for a job that failed."""

from __future__ import annotations

from training.launch.rendezvous.rounds import Head, Round, ended_in_my_round


def closed_formed(n: int, prev_n: int) -> Round:
    """A formed round's record closed, as an agent reads it from the head (no member lists)."""
    return Head.of(Round(n=n, formed=True, participants=["a", "b"], prev_n=prev_n, closed=True)).as_round()


def closed_open(n: int, prev_n: int) -> Round:
    """The next round opened (a node re-forming after its workers failed), then the rendezvous closed."""
    return Head.of(Round(n=n, formed=False, prev=["a", "b"], prev_n=prev_n, closed=True)).as_round()


def test_a_participant_of_the_newest_round_learns_the_job_stopped_without_it():
    assert ended_in_my_round(closed_formed(3, prev_n=2), 3)
    assert ended_in_my_round(closed_open(4, prev_n=3), 3)


def test_a_hot_spare_that_never_took_a_place_is_not_told_so():
    assert not ended_in_my_round(closed_formed(3, prev_n=2), None)
    assert not ended_in_my_round(closed_open(4, prev_n=3), None)


def test_a_node_a_newer_round_replaced_may_have_seen_the_job_finish_without_it():
    assert not ended_in_my_round(closed_formed(4, prev_n=3), 3)
    assert not ended_in_my_round(closed_open(5, prev_n=4), 3)

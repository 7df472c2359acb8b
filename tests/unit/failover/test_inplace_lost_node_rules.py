"""A lost node in a ``failover.in_place`` job, as pure rules: which round keeps the survivors' in-place scope
(training/launch/rendezvous/rounds.py ``keeps_workers``), and when the joiners decide an epoch none of whose old
members is left (training/job/inplace/agreement.py). Through the launcher: tests/e2e/failover/
test_inplace_lost_node_e2e.py."""

from __future__ import annotations

import pytest

from tests.unit.failover.test_inplace_agreement import SETTINGS, Clock, DictBoard, entry
from training.checkpoint.generation import Generation
from training.job.inplace.agreement import InPlaceFailed, Membership, agree
from training.launch.rendezvous import rounds

BEFORE = rounds.formed(rounds.Round(n=4, scope=2), ["a", "b", "c"], {"a", "b", "c", "s"})


def reform(live, lost, *, in_place=True, stuck=(), taken_out=frozenset(), before=BEFORE):
    return rounds.reformed(
        before,
        live,
        lost=lost,
        stuck=list(stuck),
        taken_out=taken_out,
        standby={"s"},
        min_nodes=1,
        max_nodes=3,
        now=0.0,
        in_place=in_place,
    )


def test_a_spare_in_a_lost_nodes_place_keeps_the_survivors_scope_and_the_round_store_prefix():
    r = reform(["s", "c", "a"], ["b"])
    assert r.participants == ["a", "s", "c"] and r.scope == 2 and r.in_place_scope == 2
    head = rounds.Head.loads(rounds.Head.of(r).dumps())
    assert head.in_place_scope == 2 and head.as_round().in_place_scope == 2  # what the spare's agent reads
    assert Generation(round=5, prefix="p/", scope=r.scope).in_place_scope == 2  # its workers' board scope


def test_a_spare_in_rank_0s_place_keeps_the_scope_and_serves_the_rounds_store():
    r = reform(["s", "c", "b"], ["a"])  # rank 0's node lost: its agent served the round's store
    assert r.participants == ["s", "b", "c"] and r.in_place_scope == 2  # the survivors in their ranks
    assert r.participants[0] == "s"  # node rank 0: the closer names its agent's store for the round


def test_a_spare_in_a_stragglers_place_keeps_the_scope_in_an_in_place_job_only():
    """A straggler's node taken out: in an in-place job only its workers stop, the survivors recover in place."""
    assert reform(["s", "c", "a"], ["b"], taken_out={"b"}).in_place_scope == 2
    assert reform(["s", "c", "a"], ["b"], taken_out={"b"}, in_place=False).in_place_scope == 5  # every worker stops


def test_every_other_re_formation_gives_the_round_its_own_scope():
    assert reform(["s", "c", "a"], ["b"], in_place=False).in_place_scope == 5  # not an in-place job
    assert reform(["c", "a"], ["b"]).in_place_scope == 5  # no spare: the world shrinks
    assert reform(["s", "c", "a", "b"], [], stuck=["b"]).in_place_scope == 5  # b lives: its workers may run
    assert rounds.next_round(BEFORE, ["b"]).in_place_scope == 5  # an open round: every worker starts again
    assert rounds.Round(n=7).in_place_scope == 7


def test_joiners_decide_once_every_old_member_is_reported_gone():
    """Old members a, b, c: a lost node's (b), reported by the spare that took its rank, and survivors left blocked
    with it and replaced by their agents (a, c). The joiners decide, in the old ranks of their ids."""
    board = DictBoard()
    board.decisions[1] = Membership(1, ("r0-a", "r1-b", "r2-c"), 9, "h:a")
    board.others = [(2, entry("r1-s", -1, -1)), (2, entry("r2-c2", -1, -1))]
    for m in ("r0-a", "r1-b", "r2-c"):
        board.report_gone(m)
    clock = Clock()
    decided = agree(board, entry("r0-a2", -1, -1), board.decisions[1], SETTINGS, clock=clock, sleep=clock.sleep)
    assert decided.members == ("r0-a2", "r1-s", "r2-c2") and decided.step == -1
    assert clock.now < SETTINGS.gather_s  # at once: nobody is left to wait for


def test_a_joiner_still_waits_while_one_old_member_is_not_gone():
    board = DictBoard()
    board.decisions[1] = Membership(1, ("r0-a", "r1-b"), 9, "h:a")
    board.report_gone("r1-b")
    clock = Clock()
    with pytest.raises(InPlaceFailed, match="no member of epoch 1 decided it"):
        agree(board, entry("r1-s", -1, -1), board.decisions[1], SETTINGS, clock=clock, sleep=clock.sleep)
    assert 2 not in board.decisions  # r0-a may still check in: only it decides

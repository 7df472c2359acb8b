"""The in-process recovery's agreement (training/job/inplace/agreement.py) on a dictionary board and a virtual clock:
who decides, when, what the decision holds, and every way it falls back. Real processes on gloo and etcd:
tests/integration/failover/test_inplace_recovery.py."""

from __future__ import annotations

import pytest

from training.job.inplace.agreement import (
    AgreementSettings,
    BoardUnavailable,
    CheckIn,
    InPlaceFailed,
    Membership,
    NotChosen,
    agree,
    propose,
    ready,
)


class DictBoard:
    """The MembershipBoard protocol in a dictionary; ``others`` check in whenever this member reads the check-ins."""

    def __init__(self):
        self.ins: dict[int, dict[str, CheckIn]] = {}
        self.decisions: dict[int, Membership] = {}
        self.gone_members: set[str] = set()
        self.others: list[tuple[int, CheckIn]] = []
        self.down = False

    def _up(self):
        if self.down:
            raise BoardUnavailable("no etcd member answered (all down)")

    def latest(self):
        self._up()
        return self.decisions[max(self.decisions)] if self.decisions else None

    def check_in(self, epoch, entry):
        self._up()
        self.ins.setdefault(epoch, {})[entry.member] = entry

    def check_ins(self, epoch):
        self._up()
        for e, entry in self.others:
            self.ins.setdefault(e, {})[entry.member] = entry
        self.others = []
        return dict(self.ins.get(epoch, {}))

    def decide(self, decision):
        self._up()
        return self.decisions.setdefault(decision.epoch, decision)

    def decision(self, epoch):
        self._up()
        return self.decisions.get(epoch)

    def report_gone(self, member):
        self.gone_members.add(member)

    def gone(self):
        self._up()
        return set(self.gone_members)


class Clock:
    """Virtual time: ``sleep`` advances it, so a bound of seconds costs the test none."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


EPOCH1 = Membership(1, ("a", "b", "c"), 9, "h:1")
SETTINGS = AgreementSettings(gather_s=1.0, bound_s=5.0, poll_s=0.01)


def entry(member, step, prev_rank, store=None):
    return CheckIn(member, step, prev_rank, store or f"h:{member}")


def run(board, me, previous=EPOCH1, settings=SETTINGS):
    clock = Clock()
    return agree(board, me, previous, settings, clock=clock, sleep=clock.sleep), clock.now


def test_old_members_keep_their_ranks_joiners_fill_the_gaps_and_rank_0s_store_forms_the_group():
    d = propose(2, {"z": entry("z", -1, -1), "c": entry("c", 9, 2), "a": entry("a", 9, 0), "y": entry("y", -1, -1)})
    assert d == Membership(2, ("a", "y", "c", "z"), 9, "h:a")
    assert d.rank("y") == 1 and d.world_size == 4


def test_the_resume_step_is_the_smallest_and_steps_further_apart_refuse():
    assert propose(2, {"a": entry("a", 10, 0), "b": entry("b", 9, 1)}).step == 9  # a rolls back one step
    refused = propose(2, {"a": entry("a", 11, 0), "b": entry("b", 9, 1)})
    assert refused.refused == "the members' steps 9..11 are more than 1 apart (state in doubt)"
    assert propose(2, {"j": entry("j", -1, -1)}).step == -1  # nobody holds state: a first start


def test_a_decider_waits_for_old_members_unless_they_are_in_or_reported_gone():
    both = {"a": entry("a", 9, 0), "b": entry("b", 9, 1)}
    assert not ready(both, set(), EPOCH1, SETTINGS, waited_s=0.5)
    assert ready(both, {"c"}, EPOCH1, SETTINGS, waited_s=0.0)  # c's agent saw it exit
    assert ready(both, set(), EPOCH1, SETTINGS, waited_s=1.0)  # c lost with nobody to say so: gather_s
    fewer = AgreementSettings(gather_s=1.0, bound_s=5.0, min_members=3)
    assert not ready(both, {"c"}, EPOCH1, fewer, waited_s=4.9)


def test_survivors_agree_at_once_when_the_dead_member_is_reported():
    board = DictBoard()
    board.others = [(2, entry("b", 9, 1))]
    board.report_gone("c")
    decided, took = run(board, entry("a", 10, 0))
    assert decided == Membership(2, ("a", "b"), 9, "h:a") and board.latest() == decided
    assert took < 0.05


def test_without_a_report_the_decision_comes_after_gather_s():
    board = DictBoard()
    board.others = [(2, entry("b", 9, 1))]
    decided, took = run(board, entry("a", 9, 0))
    assert decided.members == ("a", "b")
    assert SETTINGS.gather_s <= took < SETTINGS.gather_s + 0.05


def test_a_joiner_never_decides_while_an_epoch_exists():
    board = DictBoard()
    with pytest.raises(
        InPlaceFailed, match=r"^in-place recovery: epoch 2 not agreed within 5 s \(no member of epoch 1"
    ):
        run(board, entry("j", -1, -1))
    assert board.decisions == {}
    board.decisions[2] = Membership(2, ("a", "b", "j"), 9, "h:a")  # the survivors let it in
    assert run(board, entry("j", -1, -1))[0].rank("j") == 2


def test_the_first_epoch_is_decided_by_anyone_once_enough_are_in():
    board = DictBoard()
    board.others = [(1, entry("b", -1, -1)), (1, entry("c", -1, -1))]
    first = AgreementSettings(gather_s=1.0, bound_s=5.0, min_members=3)
    decided, _ = run(board, entry("a", -1, -1), previous=None, settings=first)
    assert decided == Membership(1, ("a", "b", "c"), -1, "h:a")


def test_an_epoch_decided_without_this_member_is_not_chosen():
    board = DictBoard()
    board.decisions[2] = Membership(2, ("a", "b"), 9, "h:a")
    with pytest.raises(NotChosen, match="epoch 2 was formed without c"):
        run(board, entry("c", 9, 2))


def test_a_refused_epoch_fails_every_member_in_one_line():
    board = DictBoard()
    board.others = [(2, entry("b", 7, 1))]
    board.report_gone("c")
    with pytest.raises(InPlaceFailed) as raised:
        run(board, entry("a", 9, 0))
    assert str(raised.value) == (
        "in-place recovery: epoch 2 refused: the members' steps 7..9 are more than 1 apart (state in doubt): "
        "falling back to a full restart from the newest complete snapshot"
    )
    with pytest.raises(InPlaceFailed, match="refused"):  # b reads the same refusal: nobody forms a group
        run(board, entry("b", 7, 1))


def test_a_store_that_does_not_answer_ends_at_the_bound_naming_it():
    board = DictBoard()
    board.down = True
    with pytest.raises(InPlaceFailed) as raised:
        run(board, entry("a", 9, 0))
    assert "epoch 2 not agreed within 5 s (0 checked in, 1 needed" in str(raised.value)
    assert "the store: no etcd member answered (all down)" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_settings_that_cannot_work_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"gather_s=5 must be above 0 and below bound_s=5"):
        AgreementSettings(gather_s=5, bound_s=5)
    with pytest.raises(ValueError, match=r"min_members=0 >= 1"):
        AgreementSettings(min_members=0)

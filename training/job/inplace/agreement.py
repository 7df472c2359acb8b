"""Agreeing a new membership in place: who is in epoch N+1, at which step it resumes, whose store it forms on.

Every member of epoch N that saw a failure (its collective raised) or a joiner (the store showed one, agreed through
the old group at a step boundary) checks in to epoch N+1 with the last step whose collectives completed on it. A
member of epoch N writes the decision once every member of N has checked in or been reported gone (by whoever saw it
go: its agent's ``waitpid`` sees a killed worker at once), or once ``gather_s`` has passed since its own check-in (a
member lost with nobody to report it: waiting for its lease to expire would cost the lease's TTL), and at least
``min_members`` are in. The decision is created once (compare-and-set on an absent key): whoever writes
first, every member reads the same one. A joiner (no rank in epoch N) checks in too but never decides while a
member of epoch N may still check in, so a joiner cannot form a group without the survivors; for the very first
epoch (no decision yet) everyone may decide, and ``min_members`` says how many make a job. Once every member of
epoch N is reported gone (a lost node's workers, reported by the spare that takes their ranks, and survivors that
stayed blocked in a collective with it, killed and replaced by their agents), the joiners decide: no old member is
left to.

The resume step is the smallest step checked in. Ranks of a synchronous job are at most one step apart (a
collective can complete on one rank and fail on another), so a member one step ahead rolls back one step; members
further apart mean a state in doubt: the decision then refuses, and every member raises :class:`InPlaceFailed`,
which the caller turns into today's full restart from the newest complete snapshot. So does a decision that does
not include this member, a store that does not answer, or no decision within ``bound_s``.

Nothing here imports torch or the launcher: the store is the :class:`MembershipBoard` protocol (etcd implements it
in ``training.launch.inplace_board``; the unit tests with a dictionary).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol


@dataclass(frozen=True)
class AgreementSettings:
    """How long the members of a re-formation wait for each other.

    Attributes:
        gather_s: seconds a member of the old epoch waits, after its own check-in, for old members that neither
            checked in nor were reported gone, before it decides without them (survivors checked in within 20 ms
            of each other here; the rest is margin for a loaded host: a survivor left out falls back to a full
            restart, a longer wait costs only the failures nobody reports).
        bound_s: seconds after which a member gives up on agreeing (no decision, store away) and raises
            :class:`InPlaceFailed`: the caller falls back to a full restart.
        poll_s: seconds between two reads of the store while waiting.
        min_members: the fewest members a decision may hold (fewer: wait for a replacement, up to ``bound_s``).
    """

    gather_s: float = 1.0
    bound_s: float = 5.0
    poll_s: float = 0.01
    min_members: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.gather_s < self.bound_s:
            raise ValueError(
                f"gather_s={self.gather_s} must be above 0 and below bound_s={self.bound_s} (e.g. 0.25 and 5)"
            )
        if self.poll_s <= 0 or self.min_members < 1:
            raise ValueError(f"poll_s={self.poll_s} must be > 0 and min_members={self.min_members} >= 1")


@dataclass(frozen=True)
class CheckIn:
    """One member's entry for the next epoch.

    Attributes:
        member: the member's id (stable for its process: host and pid).
        step: the last step whose collectives completed on it; -1: it holds no training state (a joiner).
        prev_rank: its rank in the epoch before; -1: it was not a member of it.
        store: ``host:port`` of its store server, which the new group forms on if it gets rank 0.
    """

    member: str
    step: int
    prev_rank: int
    store: str

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "CheckIn":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Membership:
    """A decided epoch.

    Attributes:
        epoch: its number (1 for the first group).
        members: member ids in rank order (:func:`in_rank_order`): the old members at their old ranks and the
            joiners in the gone members' ranks when that fits, else the old members in their old order, then joiners.
        step: the step every member resumes at (-1: nobody holds state yet).
        store: ``host:port`` of rank 0's store server, where the new process group forms (under a prefix of
            this epoch's own).
        refused: why the epoch cannot be formed in place (empty when it can): every member then falls back.
    """

    epoch: int
    members: tuple[str, ...]
    step: int
    store: str
    refused: str = field(default="")

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank(self, member: str) -> int:
        return self.members.index(member)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "Membership":
        raw = json.loads(text)
        return cls(**{**raw, "members": tuple(raw["members"])})


class BoardUnavailable(RuntimeError):
    """The membership store did not answer (the agreement tries again until its bound)."""


class MembershipBoard(Protocol):
    """Where members check in and decisions are kept (one job's keys)."""

    def latest(self) -> Membership | None:
        """The newest decided epoch, or None before the first."""

    def check_in(self, epoch: int, entry: CheckIn) -> None:
        """Record ``entry`` for ``epoch`` (again: replaces this member's)."""

    def check_ins(self, epoch: int) -> dict[str, CheckIn]:
        """Every check-in for ``epoch`` by member id."""

    def decide(self, decision: Membership) -> Membership:
        """Store ``decision`` unless its epoch is decided already; return the one that holds."""

    def decision(self, epoch: int) -> Membership | None:
        """The decision for ``epoch``, or None."""

    def report_gone(self, member: str) -> None:
        """Say that ``member``'s process is gone (its agent saw it exit): nobody waits for its check-in."""

    def gone(self) -> set[str]:
        """Every member reported gone."""


class InPlaceFailed(RuntimeError):
    """In-place recovery cannot be agreed: the caller falls back to a full restart from the newest complete
    snapshot (today's path). The message is one line saying why."""


class NotChosen(InPlaceFailed):
    """The epoch was decided without this member (it checked in late): a joiner tries the next epoch."""


#: How far apart the members' steps may be for the state to be whole after one member rolls back a step.
MAX_STEP_GAP = 1


def in_rank_order(entries: dict[str, CheckIn]) -> tuple[str, ...]:
    """Every old member keeps its old rank and the joiners (by id) take the ranks of the members gone, when that
    fits: no old rank is past the new world (so the joiners fill exactly the ranks left free, rank 0 among them
    when its holder was lost: a joiner's store forms the group and it writes the metrics as any rank 0 does, its
    record marked ``joined``). Then a survivor's shards are where they were (it keeps its live state instead of
    restoring it) and a replacement, whose id starts with the rank it replaces, takes that rank's shard.
    Otherwise (the world shrank under an old rank) the old members keep their relative order (their shards move
    least) and the joiners follow."""
    old = sorted((e.prev_rank, m) for m, e in entries.items() if e.prev_rank >= 0)
    joiners = sorted(m for m, e in entries.items() if e.prev_rank < 0)
    if old and old[-1][0] < len(entries):
        slots: list[str | None] = [None] * len(entries)
        for rank, m in old:
            slots[rank] = m
        free = iter(joiners)
        return tuple(m if m is not None else next(free) for m in slots)
    return tuple(m for _, m in old) + tuple(joiners)


def propose(epoch: int, entries: dict[str, CheckIn]) -> Membership:
    """The decision for ``epoch`` from its check-ins: a refusal when the steps are further apart than one."""
    members = in_rank_order(entries)
    steps = sorted({e.step for e in entries.values() if e.step >= 0})
    step = steps[0] if steps else -1
    refused = ""
    if steps and steps[-1] - steps[0] > MAX_STEP_GAP:
        refused = f"the members' steps {steps[0]}..{steps[-1]} are more than {MAX_STEP_GAP} apart (state in doubt)"
    return Membership(epoch, members, step, entries[members[0]].store, refused)


def ready(
    entries: dict[str, CheckIn],
    gone: set[str],
    previous: Membership | None,
    settings: AgreementSettings,
    waited_s: float,
) -> bool:
    """Whether a decider may decide now: enough members, and every old member in or gone, or ``gather_s`` waited."""
    if len(entries) < settings.min_members:
        return False
    accounted = previous is None or set(previous.members) <= set(entries) | gone
    return accounted or waited_s >= settings.gather_s


def agree(
    board: MembershipBoard,
    me: CheckIn,
    previous: Membership | None,
    settings: AgreementSettings,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Membership:
    """Check ``me`` in to the epoch after ``previous`` and return its decision, which includes ``me``.

    Raises :class:`InPlaceFailed` (one line: why, and that the job falls back) when no decision comes within
    ``settings.bound_s``, the decision refuses, or ``me`` is one step further than the decision can roll back;
    :class:`NotChosen` when the epoch was decided without ``me``."""
    epoch = (previous.epoch if previous else 0) + 1
    decider = previous is None or me.member in previous.members
    checked_gone = float("-inf")  # when a joiner last looked whether every old member is gone
    start = clock()
    deadline, checked_at, seen, trouble = start + settings.bound_s, None, 0, ""
    decided = None
    while decided is None:
        try:
            if checked_at is None:
                board.check_in(epoch, me)
                checked_at = clock()
            decided = board.decision(epoch)
            if decided is None and not decider and clock() - checked_gone >= settings.gather_s / 4:
                checked_gone = clock()  # (a joiner looks now and then: the survivors usually decide first)
                decider = set(previous.members) <= board.gone()
            if decided is None and decider:
                entries = board.check_ins(epoch)
                seen = len(entries)
                if ready(entries, board.gone(), previous, settings, clock() - checked_at):
                    decided = board.decide(propose(epoch, entries))
        except BoardUnavailable as e:
            trouble = f"; the store: {' '.join(str(e).split())[:160]}"  # one line, whatever the store said
        if decided is None:
            if clock() >= deadline:
                state = (
                    f"{seen} checked in, {settings.min_members} needed"
                    if decider
                    else f"no member of epoch {epoch - 1} decided it"
                )
                raise InPlaceFailed(
                    f"in-place recovery: epoch {epoch} not agreed within {settings.bound_s:g} s ({state}{trouble}): "
                    f"falling back to a full restart from the newest complete snapshot"
                )
            sleep(settings.poll_s)
    if decided.refused:
        raise InPlaceFailed(
            f"in-place recovery: epoch {epoch} refused: {decided.refused}: falling back to a full restart from "
            f"the newest complete snapshot"
        )
    if me.member not in decided.members:
        raise NotChosen(
            f"in-place recovery: epoch {epoch} was formed without {me.member} (it checked in after the decision): "
            f"falling back to a full restart from the newest complete snapshot"
        )
    if me.step >= 0 and decided.step >= 0 and not 0 <= me.step - decided.step <= MAX_STEP_GAP:
        raise InPlaceFailed(
            f"in-place recovery: epoch {epoch} resumes at step {decided.step} but {me.member} holds step {me.step} "
            f"(state in doubt): falling back to a full restart from the newest complete snapshot"
        )
    return decided


#: What builds the job's membership board in a worker (:func:`register_board`); None: none installed. Kept here,
#: where nothing imports torch: a cold worker installs it before ``main()`` and reports whether torch was preloaded.
board_factory: Callable[[], "MembershipBoard"] | None = None


def register_board(factory: Callable[[], "MembershipBoard"]) -> None:
    """Install how a worker reaches the job's membership board: this project's agent does it in its workers
    (:func:`training.launch.inplace_board.install`), as only the launch room may talk to etcd (the commit fence's
    way, :func:`training.checkpoint.fence.register`)."""
    global board_factory
    board_factory = factory

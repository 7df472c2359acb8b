"""The rendezvous's decisions, as pure functions of what the store holds (no I/O: the handler does that).

The store holds, under the job's prefix:

* ``members/<id>``: one key per live agent, under the agent's lease (gone when its keep-alives stop for the
  lease's TTL); its value says whether the agent asked to be a spare (``standby``);
* ``round``: the :class:`Round` record, changed only by compare-and-set;
* ``head``: its :class:`Head`, written in the same transaction as every change of ``round`` (so both have the
  same mod revision): the record without its member lists, which is what every agent watches;
* ``joined/<n>/<id>``: an agent's wish to train in open round ``n``, or its confirmation that it took its place in
  round ``n`` formed without joins (:func:`reformed`); under its lease;
* ``seats/<n>/<page>``: formed round ``n``'s ranks in :class:`Seats` pages, written in the transaction that forms
  it (older rounds' pages deleted in it): each agent reads its own page, not the whole record. An agent that had
  a place in the formed round before reads none: the head names the seats that changed (:func:`seat_changes`).

Two roles. Every agent runs :func:`agent_step` until it has a place (``DONE``). One agent, the *closer* (the
oldest live member, etcd's election recipe), also runs :func:`closer_step` on every change it watches: it
alone reads every member and joined key, so a round costs O(N) store events, not O(N^2) (each agent watches
only the round's ``head`` and the member created just before it).

* The closer opens the job's first round (one transaction; every agent racing to create it cost one each).
* A round is *open* while agents join it and *formed* once the closer closes it with its participants (at
  most MAX, at least MIN), who train; live members left out are the hot spares.
* The closer closes an open round as soon as every live member has joined (no waiting out a last call for
  nobody), or ``last_call_s`` after it reached MIN (a member that lives but does not come). The job's first
  round, which no node has trained in yet, waits out the last call below MAX: the other nodes may still be
  starting. It never closes while a live participant of the round before has not joined (torch's contract: a
  node that arrives while a round runs waits until the participants leave it): that agent is still stopping its
  workers (a stop at a step boundary saves a checkpoint first, a hung collective takes torchrun's 30 s SIGTERM
  grace), and a round closed without it would be a second worker group of the job beside the one still
  training, both writing snapshots and checkpoints (seen: a late node took rank 0 of world 1 while the round
  before trained on). Only its lease ending (its agent gone) lets the round close without it.
* A formed round one of whose participants is no longer live (a lost node, its lease expired) is replaced at
  once by the next *formed* round (:func:`reformed`, one transaction of the closer): its live participants keep
  their ranks and live members waiting beside it (spares, newcomers) fill the places, as :func:`choose` orders
  them; the record names the lost node, so every agent can say why. Nobody joins it: each agent hears the new
  head, stops its workers and takes its place. Joining first (an open round, a joined key from each of N-1
  agents, then the close) was the largest cost of a 1,024-node re-formation (~1.1 s of ~4.5 s, measured
  2026-11-27). A participant confirms it came with its joined key for the round, off its critical path; one
  that has not within ``last_call_s`` + :data:`STOPPING_WORKERS_S` of the round forming lives but is stuck
  (an agent blocked on a worker that cannot be killed): the closer replaces the round again without it
  (``stuck``), as the open round's last call would have left it out. Too few live members for MIN: an open
  round, as below.
* A formed round is replaced by a new open one when a participant comes back to re-join (its workers failed:
  it opens the next round), or when a live member waits and the round has room for it (it opens the next
  round). A spare that sees a full, healthy formed round waits.
* Places go first to the participants of the round before, in their old ranks (their own node's snapshot is
  where they left it), then to the others, members that asked to stand by last. Among the others, a member
  that gave its node index (``T5_NODE_RANK``: the launcher's node number, Slurm's ``SLURM_NODEID``) comes in
  that order, so a job's first round gives node i rank i (logs, fault targets and each node's memory directory
  agree with the cluster's numbering); members without one follow in the order they joined.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict, dataclass, field, replace
from enum import Enum


class Step(Enum):
    NEW_ROUND = "new round"  # agent: replace the formed round with an open one
    JOIN = "join"  # agent: put its joined key for the open round
    DONE = "done"  # agent: it has a place in the formed round
    STAND_BY = "stand by"  # agent: a hot spare; wait for the round to change
    WAIT = "wait"  # agent: joined, waiting for the closer (or the closer: nothing to do)
    OPEN = "open"  # closer: open the job's first round
    MARK_MIN = "mark min"  # closer: the open round reached MIN (its last call starts)
    CLOSE = "close"  # closer: form the open round
    REOPEN = "reopen"  # closer: a participant of the formed round is lost (or stuck): the next round
    NOTE_SPARES = "note spares"  # closer: the live members waiting beside the formed round changed
    NOTE_ARRIVING = "note arriving"  # closer: the late nodes that joined the open round changed (their count)


@dataclass
class Round:
    """The round record (``round`` key).

    Attributes:
        n: the round's number.
        formed: closed with its participants (they train); open before.
        participants: member ids in rank order (formed rounds).
        prev: the participants of the round before (rank order for the next).
        min_at: when an open round reached MIN (wall clock, the closer's), for the last call.
        lost: the participants of the round before that were lost (why this round exists, if so).
        store: ``host:port`` of the formed round's TCPStore: its rank-0 agent's, written when it is formed.
        closed: the job ended: no more rounds.
        spares: live members waiting beside the formed round (hot spares), kept up to date by the closer; the
            agents tell their workers how many (a straggler's node is taken out only when one waits).
        taken_out: those of ``lost`` that left on purpose (a straggler's node, ``taken-out/<id>`` keys): their
            workers stop at a step boundary by themselves, so the others' workers are not killed for them (they
            stop at the same boundary too, or, in an in-place job, recover in place).
        prev_n: the number of the formed round whose participants ``prev`` lists (-1: none).
        presumed_at: when the closer formed this round from the live members without their joins (wall clock,
            the closer's; :func:`reformed`); None for a round formed from joins. Its participants confirm with
            their joined keys (:func:`unconfirmed`).
        stuck: those of ``lost`` that were live but had not taken their place in the round before (presumed)
            in time: they are left out as lost nodes are.
        arriving: how many nodes wait to join the job in this open round (:func:`arriving`), kept by the closer:
            what ``num_nodes_waiting()`` tells torchrun's agents still in the round before.
        scope: the in-place recovery scope its workers use (``failover.in_place``, docs/inprocess.md): -1 for
            the round's own number; the scope of the round before for a round that replaces lost nodes of an
            in-place job in which the survivors' workers keep running (:func:`keeps_workers`), so a hot spare's
            workers join their running epoch instead of a new one.
    """

    n: int
    formed: bool = False
    participants: list[str] = field(default_factory=list)
    prev: list[str] = field(default_factory=list)
    min_at: float | None = None
    lost: list[str] = field(default_factory=list)
    store: str = ""
    closed: bool = False
    spares: list[str] = field(default_factory=list)
    taken_out: list[str] = field(default_factory=list)
    prev_n: int = -1
    presumed_at: float | None = None
    stuck: list[str] = field(default_factory=list)
    arriving: int = 0
    scope: int = -1

    @property
    def in_place_scope(self) -> int:
        """The in-place scope of this round's workers (``scope``, or the round's number)."""
        return self.scope if self.scope >= 0 else self.n

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Round":
        return cls(**json.loads(text))


@dataclass
class Head:
    """The ``head`` key: what every agent watches of the round record, without the lists of O(N) member ids
    (``participants``, ``prev``, ``spares``). A round changes about five times per re-formation and every agent
    hears of each change: with the whole record, 1,024 agents received 28-57 KiB each per change (up to 57 MiB
    through the store per change, O(N^2)); the head is ~110 bytes at any N (a formed round that follows another
    adds its seat changes, at most :data:`HEAD_MOVES_MAX`). An agent reads the whole record only when
    the round is formed (its place) and the closer reads it from its own watch.

    Attributes: as :class:`Round`'s; ``spares`` is how many wait, ``size`` how many participate; ``moved``: a
    formed round's seats as changes from those of round ``prev_n`` (:func:`seat_changes`), so that an agent that
    had a place there finds its own without reading its seat page (None: it reads the page).
    """

    n: int
    formed: bool = False
    closed: bool = False
    store: str = ""
    lost: list[str] = field(default_factory=list)
    taken_out: list[str] = field(default_factory=list)
    spares: int = 0
    size: int = 0  # how many participants (a formed round)
    prev_n: int = -1
    moved: dict[str, int] | None = None
    stuck: list[str] = field(default_factory=list)
    arriving: int = 0
    scope: int = -1

    @property
    def in_place_scope(self) -> int:
        return self.scope if self.scope >= 0 else self.n

    @classmethod
    def of(cls, r: Round) -> "Head":
        return cls(
            n=r.n,
            formed=r.formed,
            closed=r.closed,
            store=r.store,
            lost=r.lost,
            taken_out=r.taken_out,
            spares=len(r.spares),
            size=len(r.participants),
            prev_n=r.prev_n,
            moved=seat_changes(r) if r.formed else None,
            stuck=r.stuck,
            arriving=r.arriving,
            scope=r.scope,
        )

    def as_round(self) -> Round:
        """The record this head stands for, without its member lists: all an agent needs of an open or closed
        round (an open round's lists are the closer's business)."""
        return Round(
            n=self.n,
            formed=self.formed,
            closed=self.closed,
            store=self.store,
            lost=self.lost,
            taken_out=self.taken_out,
            stuck=self.stuck,
            arriving=self.arriving,
            prev_n=self.prev_n,
            scope=self.scope,
        )

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Head":
        return cls(**json.loads(text))


#: Participants per :class:`Seats` page (a page is ~2 KiB).
SEATS_PER_PAGE = 64
#: etcd's default limit of operations in one transaction (``--max-txn-ops``), which the members here and on the
#: clusters keep: one more is refused ("too many operations in txn request"; checked against etcd by a test).
ETCD_MAX_TXN_OPS = 128
#: The operations of the transaction that forms a round besides its seat pages: the round, its head, and the
#: deletion of older rounds' pages.
FORMING_OPS = 3
#: The most participants a round can have: every seat page goes into the one transaction that forms it,
#: so 125 pages of 64, 8,000 nodes (the launcher refuses a larger --nodes on etcd).
MAX_ROUND_NODES = (ETCD_MAX_TXN_OPS - FORMING_OPS) * SEATS_PER_PAGE


@dataclass
class Seats:
    """One page of a formed round's seating (``seats/<n>/<page>``): the ranks of the participants whose id falls
    on this page (:func:`page_of`) and the round's size. Taking a place reads this page, O(1) bytes, where the
    whole record is O(N): 1,024 agents each reading the ~40 KiB record at once were 40 MiB through the members'
    JSON gateway, and the reads ran past their 2 s timeout (measured 2026-11-27, ``tools.rdzv_scale``)."""

    n: int
    size: int
    ranks: dict[str, int]

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Seats":
        return cls(**json.loads(text))


#: The most seat changes a head carries (:func:`seat_changes`, ~60 bytes each; every agent hears the head).
HEAD_MOVES_MAX = 16


def seat_changes(r: Round) -> dict[str, int] | None:
    """Formed round ``r``'s seats as changes from round ``r.prev_n``'s (``prev``, the ranks its participants
    had there): each participant whose rank is new or changed, and each of ``prev`` that has no place (-1). A
    round that replaces a lost node changes one or two seats; the 1,023 others keep theirs and need not read
    their page (1,023 reads at once through the members' gateway were 0.4-1.7 s of a re-formation, measured
    2026-11-27). None: the job's first round, or more than :data:`HEAD_MOVES_MAX` changes."""
    if r.prev_n < 0:
        return None
    old = {p: i for i, p in enumerate(r.prev)}  # as seat_pages gives them (a member listed twice: its last)
    new = {p: i for i, p in enumerate(r.participants)}
    changes = {p: i for p, i in new.items() if old.get(p) != i}
    changes.update({p: -1 for p in old if p not in new})
    return changes if len(changes) <= HEAD_MOVES_MAX else None


def seat_from_head(head: Head, me: str, had: tuple[int, str, int] | None) -> Seats | None:
    """``me``'s seat in formed round ``head`` from its changes, if ``had`` (the round number, member id and rank
    of this agent's last place) is a place in the round they are relative to (as a page: ``me`` with its rank,
    or no ``me`` when it has none); None when the agent must read its page."""
    if head.moved is None or had is None or had[0] != head.prev_n or had[1] != me:
        return None
    rank = head.moved.get(me, had[2])
    return Seats(n=head.n, size=head.size, ranks={me: rank} if rank >= 0 else {})


def page_count(size: int) -> int:
    """How many :class:`Seats` pages a round of ``size`` participants has (at least one)."""
    return max(1, math.ceil(size / SEATS_PER_PAGE))


def page_of(member: str, pages: int) -> int:
    """The page on which ``member``'s seat is, of ``pages`` (a hash of its id: every agent finds its own page
    without reading the others)."""
    return zlib.crc32(member.encode()) % pages


def seat_pages(r: Round) -> dict[int, Seats]:
    """Formed round ``r``'s seats, by page (every page present, also an empty one)."""
    pages = page_count(len(r.participants))
    out = {k: Seats(n=r.n, size=len(r.participants), ranks={}) for k in range(pages)}
    for rank, member in enumerate(r.participants):
        out[page_of(member, pages)].ranks[member] = rank
    return out


def lost_participants(r: Round, live: set[str]) -> list[str]:
    """Participants of a formed round whose member key is gone (their lease expired)."""
    return [p for p in r.participants if p not in live] if r.formed else []


def unconfirmed(
    r: Round,
    live: set[str],
    joined: list[str],
    *,
    now: float,
    last_call_s: float,
    answering_since: float = float("-inf"),
) -> list[str]:
    """Live participants of presumed round ``r`` (:func:`reformed`) without a joined key for it once
    ``last_call_s`` + :data:`STOPPING_WORKERS_S` have passed since it formed, or since the store answers again
    (``answering_since``: an outage took the confirmations with the leases): alive, but stuck before taking their
    place (the others' workers wait for theirs). Empty for a round formed from joins, or before the deadline."""
    if not r.formed or r.presumed_at is None:
        return []
    if now < max(r.presumed_at, answering_since) + last_call_s + STOPPING_WORKERS_S:
        return []
    came = set(joined)
    return [p for p in r.participants if p in live and p not in came]


def reformed(
    r: Round,
    live: list[str],
    *,
    lost: list[str],
    stuck: list[str] = (),
    taken_out: set[str] = frozenset(),
    standby: set[str] = frozenset(),
    node_index: dict[str, int] | None = None,
    min_nodes: int,
    max_nodes: int,
    now: float,
    in_place: bool = False,
) -> Round | None:
    """The formed round that replaces formed round ``r`` at once (see the module docstring): its live
    participants in their old ranks, then the other live members (``live``, oldest first) as :func:`choose`
    orders them, without ``stuck``; ``lost``: the participants it replaces. None when fewer than ``min_nodes``
    are left: the closer opens the next round instead. ``in_place``: the job recovers in place
    (``failover.in_place``): the round keeps ``r``'s in-place scope when :func:`keeps_workers` says so."""
    nxt = next_round(r, [*lost, *stuck], taken_out)
    nxt.stuck = list(stuck)
    left_out = set(stuck)
    present = [m for m in live if m not in left_out]
    chosen = choose(nxt, present, set(present), set(standby), max_nodes, node_index)
    if len(chosen) < min_nodes:
        return None
    out = formed(nxt, chosen, set(present))
    out.presumed_at = now
    if in_place and keeps_workers(r, out):
        out.scope = r.in_place_scope
    return out


def keeps_workers(before: Round, after: Round) -> bool:
    """Whether the survivors' workers of formed round ``before`` go on in ``after`` (an in-place job): ``after``
    replaces only lost nodes (none stuck: its workers may still run), at the same size, with every survivor in its
    old rank. Then the spares' workers join the survivors' running epoch as the replacements of the lost ranks;
    otherwise every worker starts again, as in any other job. A node taken out as a straggler counts as lost: in
    an in-place job only its own workers stop at the agreed step boundary, the others recover in place
    (:mod:`training.job.stragglers`). Rank 0's node may be among the lost: a spare then takes node rank 0 and
    serves the round's store, and the survivors' agents move to it (their exit barrier:
    :meth:`.handler.EtcdRendezvousHandler.place_store`)."""
    if not after.lost or after.stuck or len(after.participants) != len(before.participants):
        return False
    lost = set(after.lost)
    return all(after.participants[i] == p for i, p in enumerate(before.participants) if p not in lost)


def agent_step(
    me: str, last_trained: int, r: Round | None, joined: bool, *, max_nodes: int, seats: Seats | None = None
) -> Step:
    """What agent ``me`` does next; ``last_trained``: the round it trained in (-1: none); ``joined``: whether
    its joined key for ``r`` is in; ``seats``: ``me``'s page of formed round ``r`` (the agents' view of a formed
    round; without it, ``r``'s own participants)."""
    if r is None:  # the closer opens the job's first round (N agents racing to create it cost N transactions)
        return Step.WAIT
    if not r.formed:
        return Step.WAIT if joined else Step.JOIN
    seats = seats or Seats(n=r.n, size=len(r.participants), ranks={p: i for i, p in enumerate(r.participants)})
    if me in seats.ranks and r.n > last_trained:
        return Step.DONE
    if r.n <= last_trained or (me not in seats.ranks and seats.size < max_nodes):
        return Step.NEW_ROUND
    return Step.STAND_BY


#: How much longer than the last call a participant of a round formed without joins (:func:`reformed`) has to
#: confirm its place before it counts as stuck: torchrun gives a worker group 30 s from SIGTERM to SIGKILL when
#: it stops it (``PContext.close``), then the agent takes its place. (An open round waits for the participants of
#: the round before without a bound: :func:`closer_step`.)
STOPPING_WORKERS_S = 30.0


def closer_step(
    r: Round | None,
    live: set[str],
    joined: list[str],
    *,
    min_nodes: int,
    max_nodes: int,
    now: float,
    last_call_s: float,
    settled: bool,
    answering_since: float = float("-inf"),
) -> Step:
    """What the closer does about ``r``; ``joined``: the ids with a joined key for ``r``, in joining order (for
    a formed round: the participants that confirmed their place);
    ``settled``: the store has answered long enough that a missing member key means a lost node;
    ``answering_since``: since when it answers (wall clock, :func:`unconfirmed`)."""
    if r is None:
        return Step.OPEN
    if r.closed:
        return Step.WAIT
    if r.formed:  # right after an outage (not settled) a missing key may come back: change nothing
        if not settled:
            return Step.WAIT
        if lost_participants(r, live) or unconfirmed(
            r, live, joined, now=now, last_call_s=last_call_s, answering_since=answering_since
        ):
            return Step.REOPEN
        return Step.NOTE_SPARES if waiting(r, live) != r.spares else Step.WAIT
    present = [j for j in joined if j in live]
    if len(present) < min_nodes:
        return _note_arriving(r, live, joined, max_nodes)
    everyone_in = live <= set(joined) and (bool(r.prev) or len(present) >= max_nodes)
    # torch's contract: the next round forms only once every live participant of the round before has left it.
    # One still stopping its workers (or stuck doing so) may still be training: a round without it would be a
    # second worker group of the job beside the first. Its lease, not a timer, says when it is gone.
    still_in_prev = any(p in live and p not in joined for p in r.prev)
    if not still_in_prev and (everyone_in or (r.min_at is not None and now >= r.min_at + last_call_s)):
        return Step.CLOSE
    return Step.MARK_MIN if r.min_at is None else _note_arriving(r, live, joined, max_nodes)


def _note_arriving(r: Round, live: set[str], joined: list[str], max_nodes: int) -> Step:
    return Step.NOTE_ARRIVING if arriving(r, live, joined, max_nodes) != r.arriving else Step.WAIT


def arriving(r: Round, live: set[str], joined: list[str], max_nodes: int) -> int:
    """How many nodes wait to join the job in open round ``r`` as torch counts them (its wait list): live members
    that joined it and were not participants of the round before, as many as there is room for beside the live
    ones that were (torch puts the rest on its redundancy list). 0 for the job's first round: no agent trains yet
    to ask, and a count that changes with each of N joins would be N writes of the head that every agent hears."""
    if r.formed or not r.prev:
        return 0
    before = set(r.prev)
    late = {j for j in joined if j in live and j not in before}
    room = max_nodes - len(before & live)
    return max(0, min(len(late), room))


def choose(
    r: Round,
    joined: list[str],
    live: set[str],
    standby: set[str],
    max_nodes: int,
    node_index: dict[str, int] | None = None,
) -> list[str]:
    """The participants of open round ``r`` when it closes, in rank order (see the module docstring);
    ``node_index``: the node index each member gave, if it gave one. O(N log N): the closer runs it with every
    member of the job (quadratic, it took 2.8 s at 8,000 nodes)."""
    index = node_index or {}
    present = [j for j in joined if j in live]
    order: dict[str, int] = {}
    for i, j in enumerate(present):
        order.setdefault(j, i)
    by_node = sorted(present, key=lambda j: (index.get(j, float("inf")), order[j]))
    old_rank = {p: i for i, p in reversed(list(enumerate(r.prev)))}  # a member listed twice: its first rank
    returning = [p for p in r.prev if p in order]
    newcomers = [j for j in by_node if j not in old_rank and j not in standby]
    spares_last = [j for j in by_node if j not in old_rank and j in standby]
    chosen = (returning + newcomers + spares_last)[:max_nodes]
    slots: list[str | None] = [None] * len(chosen)
    for p in chosen:  # old rank where it fits
        if p in old_rank and old_rank[p] < len(slots) and slots[old_rank[p]] is None:
            slots[old_rank[p]] = p
    seated = set(slots)
    rest = iter(p for p in chosen if p not in seated)
    return [s if s is not None else next(rest) for s in slots]


def waiting(r: Round, live: set[str]) -> list[str]:
    """The live members that are not participants of formed round ``r`` (its hot spares), sorted."""
    return sorted(live - set(r.participants))


def ended_in_my_round(r: Round, my_round: int | None) -> bool:
    """The closed rendezvous ``r`` (as the head says it) ended while the newest formed round was ``my_round``, the
    round this node took a place in: the job stopped without this node's workers finishing that round (a job ends
    well only when every rank of its newest round finishes), so another participant ended it on a failure (its
    restarts used up). False for a node that never took a place (a hot spare, ``my_round`` None) or that a newer
    round replaced: the job may have finished without it."""
    return my_round is not None and my_round == (r.n if r.formed else r.prev_n)


def next_round(r: Round | None, lost: list[str] = (), taken_out: set[str] = frozenset()) -> Round:
    """The open round that replaces ``r`` (``lost``: the participants it replaces because they were lost;
    ``taken_out``: the members known to have left on purpose)."""
    if r is None:
        return Round(n=0)
    return Round(
        n=r.n + 1,
        prev=r.participants if r.formed else r.prev,
        lost=list(lost),
        taken_out=[p for p in lost if p in taken_out],
        prev_n=r.n if r.formed else r.prev_n,
    )


def formed(r: Round, participants: list[str], live: set[str] = frozenset()) -> Round:
    return replace(r, formed=True, participants=participants, spares=sorted(set(live) - set(participants)))

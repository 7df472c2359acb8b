"""The rendezvous's decisions, as pure functions of what the store holds (no I/O: the handler does that).

The store holds, under the job's prefix: one key per live agent (``members/<id>``, under the agent's lease:
it disappears when the agent's keep-alives stop for the lease's TTL) and one *round* record (``round``), a
JSON :class:`Round` changed only by compare-and-set. An agent that wants to train calls :func:`next_step`
with the round it last trained in; it acts on the answer, reads again, and asks again, until the answer is
``DONE`` (it has a place in a formed round).

* A round is *open* while agents join it and *formed* once it is closed with its participants (at most MAX,
  at least MIN), who train; live members left out are the hot spares.
* An open round closes as soon as every live member has joined (no waiting out a last call for nobody), or
  ``last_call_s`` after it reached MIN (a member that lives but does not come). The job's first round, which
  no node has trained in yet, also waits out the last call below MAX: the other nodes may still be starting.
* A formed round is replaced by a new open one when one of its participants is no longer live (a lost node:
  its lease expired), when a participant comes back to re-join (its workers failed: everyone restarts),
  or when a live member waits and the round has room for it (a node that joined late, below MAX).
  A spare that sees a full, healthy formed round waits (``STAND_BY``).
* Places go first to the participants of the round before, in their old ranks (their own node's snapshot is
  where they left it), then to the others in the order they joined.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum


class Step(Enum):
    NEW_ROUND = "new round"        # replace the formed round with an open one that holds this agent
    JOIN = "join"                  # add this agent to the open round
    MARK_MIN = "mark min"          # record when the open round reached MIN (its last call starts)
    CLOSE = "close"                # form the open round (participants chosen by :func:`choose`)
    DONE = "done"                  # this agent has a place in the formed round
    STAND_BY = "stand by"          # a hot spare: wait for the round to change
    WAIT = "wait"                  # wait for more agents (or the last call)


@dataclass
class Round:
    """The round record (``round`` key). ``prev``: the participants of the round before, for rank order."""

    n: int
    joined: list[str] = field(default_factory=list)
    formed: bool = False
    participants: list[str] = field(default_factory=list)
    prev: list[str] = field(default_factory=list)
    min_at: float | None = None

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Round":
        return cls(**json.loads(text))


def lost_participants(r: Round, live: set[str]) -> list[str]:
    """Participants of a formed round whose member key is gone (their lease expired)."""
    return [p for p in r.participants if p not in live] if r.formed else []


def next_step(me: str, last_trained: int, r: Round | None, live: set[str], *, min_nodes: int, max_nodes: int,
              now: float, last_call_s: float) -> Step:
    """What agent ``me`` does next (see the module docstring); ``last_trained``: the round it trained in, -1."""
    if r is None:
        return Step.NEW_ROUND
    if r.formed:
        if me in r.participants and r.n > last_trained:
            return Step.DONE
        if r.n <= last_trained or lost_participants(r, live):
            return Step.NEW_ROUND
        if me not in r.participants and len(r.participants) < max_nodes:
            return Step.NEW_ROUND
        return Step.STAND_BY
    if me not in r.joined:
        return Step.JOIN
    present = [j for j in r.joined if j in live]
    if len(present) < min_nodes:
        return Step.WAIT
    everyone_in = live <= set(r.joined) and (bool(r.prev) or len(present) >= max_nodes)
    if everyone_in or (r.min_at is not None and now >= r.min_at + last_call_s):
        return Step.CLOSE
    return Step.MARK_MIN if r.min_at is None else Step.WAIT


def choose(r: Round, live: set[str], max_nodes: int) -> list[str]:
    """The participants of open round ``r`` when it closes, in rank order (see the module docstring)."""
    present = [j for j in r.joined if j in live]
    returning = [p for p in r.prev if p in present]
    newcomers = [j for j in present if j not in r.prev]
    chosen = (returning + newcomers)[:max_nodes]
    slots: list[str | None] = [None] * len(chosen)
    for p in chosen:  # old rank where it fits
        if p in r.prev and r.prev.index(p) < len(slots) and slots[r.prev.index(p)] is None:
            slots[r.prev.index(p)] = p
    rest = iter(p for p in chosen if p not in slots)
    return [s if s is not None else next(rest) for s in slots]


def new_round(r: Round | None, me: str) -> Round:
    """The open round that replaces ``r``, joined by ``me``."""
    if r is None:
        return Round(n=0, joined=[me])
    return Round(n=r.n + 1, joined=[me], prev=r.participants if r.formed else r.prev)

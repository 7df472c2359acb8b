"""The worker group's generation: which round of the job's etcd rendezvous it trains in, as its agent noted it.

The ``t5-etcd`` agent notes it when it takes its place in a formed round (:func:`note`, from
:mod:`training.launch.rendezvous.handler`), before torchrun starts that round's workers; rank 0 reads it at start
(:func:`read`) for the commit fence (:mod:`.fence`). A note in the node's agent-notes directory
(``$T5F_HEARTBEAT_DIR``, as :mod:`training.job.agent_notes`), not an environment variable: warm workers are forked
from a forkserver the agent starts before its first round (:mod:`training.launch.warm_workers`), and torch gives
a forked worker only its own variables (RANK, ...) on top of the forkserver's, so a variable the agent set after a
rendezvous would never reach them. No directory (a plain ``python -m training``) or another rendezvous
(``c10d``): no note, and the fence does nothing.

The generation is the round's number. Round numbers are given by the compare-and-set on the job's round record,
so they are ordered as the rounds' etcd revisions are, and the round a group trains in stays *current* exactly as
long as its seat pages exist (the transaction that forms the next round deletes them, :func:`.layout.put_round`):
that is what the fence compares. The forming revision itself is not known to an agent that finds its seat in the
head's changes (:func:`.rounds.seat_from_head`, no read: 1,023 seat reads at once cost 0.4-1.7 s of a 1,024-node
re-formation), and the number needs no store: a group restarted while etcd is down still knows its generation.
Torch-free (the agent imports it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

#: Set by the agent for its workers (training.job.watchdog.HEARTBEAT_DIR_ENV; repeated here to stay torch-free).
HEARTBEAT_DIR_ENV = "T5F_HEARTBEAT_DIR"
ROUND_FILE = "round"


@dataclass(frozen=True)
class Generation:
    """The round a worker group trains in.

    Attributes:
        round: the round's number (the generation; larger is newer).
        prefix: the job's key prefix in etcd (``<user prefix>rdzv/<run id>/``), where the fence writes.
        scope: the in-place recovery scope of the group's workers (``failover.in_place``): the round's number (-1),
            or the round the survivors' workers started in when this round replaced lost nodes around them
            (:func:`training.launch.rendezvous.rounds.keeps_workers`).
    """

    round: int
    prefix: str
    scope: int = -1

    @property
    def in_place_scope(self) -> int:
        return self.scope if self.scope >= 0 else self.round


def _path() -> str:
    d = os.environ.get(HEARTBEAT_DIR_ENV, "")
    return os.path.join(d, ROUND_FILE) if d and os.path.isdir(d) else ""


def note(generation: Generation) -> None:
    """Agent: the round its next workers train in (atomic replace; nothing without the directory)."""
    path = _path()
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(generation), f)
        os.replace(tmp, path)


def read() -> Generation | None:
    """Worker: the round its agent noted, or None (no agent of this launcher, or not on etcd)."""
    path = _path()
    try:
        with open(path) as f:
            return Generation(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None

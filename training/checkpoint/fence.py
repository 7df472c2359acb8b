"""The commit fence: a worker group whose rendezvous round was replaced can never complete a checkpoint.

The window it closes: a group whose agent lost etcd (a partition, or the agent frozen or dead while its workers
train on) goes on training while spares form a newer round; both groups would write into the same checkpoint
directory. Rank 0 asks etcd before every commit marker (the storage tier's ``before_commit``) whether its round
is still the newest formed one, in one transaction (:class:`training.launch.rendezvous.fence.EtcdFence`: the
launch room owns etcd, and installs it in the workers it starts, :func:`register`). Refused:
:class:`~training.errors.StaleGroup` with one line naming the rounds; the step's directory never gets its marker
(the storage tier discards it) and every rank stops at the next step boundary (exit 9). No member answers: the
commit goes ahead, recorded in the marker as unconfirmed (the membership store may go down whole and training goes
on), and a later restore can still tell it from the current group's: each group records the step it restored from,
and :func:`set_aside_stale` moves aside what a replaced group wrote after that (:mod:`.stale_rule`; in-memory
snapshots carry their round too and are skipped by the same rule, :mod:`.memory`).

Every marker carries its generation (``fence.round``) either way. Without a generation (no etcd rendezvous: c10d,
a local run, a worker not started by this project's agent) the fence is :class:`NoFence`, which does nothing;
other ranks than 0 never talk to etcd.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Protocol

from training.checkpoint import generation as generation_note
from training.checkpoint.layout import SUPERSEDED, parse_step, read_marker, scan
from training.checkpoint.stale_rule import stale_checkpoints

log = logging.getLogger("training")


class Fence(Protocol):
    """What the checkpoint manager asks of a fence (:class:`NoFence`; the etcd one:
    :class:`training.launch.rendezvous.fence.EtcdFence`)."""

    round: int | None

    def commit(self, step: int) -> dict: ...
    def record_restore(self, step: int) -> None: ...
    def restores(self) -> dict[int, int] | None: ...
    def set_aside_stale(self, root: Path, restored: dict[int, int]) -> list[str]: ...
    def close(self) -> None: ...


class NoFence:
    """No etcd rendezvous (or not rank 0): every commit goes ahead, nothing is recorded or set aside."""

    round: int | None = None

    def commit(self, step: int) -> dict:
        """The fields the commit marker gets (none)."""
        return {}

    def record_restore(self, step: int) -> None:
        pass

    def restores(self) -> dict[int, int] | None:
        return {}

    def set_aside_stale(self, root: Path, restored: dict[int, int]) -> list[str]:
        return []

    def close(self) -> None:
        pass


def set_aside_stale(root: Path, restored: dict[int, int]) -> list[str]:
    """Move the complete checkpoints a replaced group wrote (:func:`.stale_rule.stale_checkpoints`, given
    ``restored``: round -> the step its group restored from) to ``superseded/``, each named with why; returns where
    they went."""
    if not restored:
        return []
    good, _ = scan(root)
    gens = {parse_step(p): (read_marker(p).get("fence") or {}).get("round") for p in good}
    moved = []
    for step, why in sorted(stale_checkpoints(gens, restored).items()):
        src = next(p for p in good if parse_step(p) == step)
        dest = Path(root) / SUPERSEDED / f"{src.name}.stale-round-{gens[step]}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)
        log.warning("WARNING: checkpoint %s not used: %s; moved to %s (kept)", src, why, dest)
        moved.append(str(dest))
    return moved


#: What builds rank 0's fence for a round its agent noted (:func:`register`); None: no fence.
_factory: Callable[[generation_note.Generation], "Fence"] | None = None


def register(factory: Callable[[generation_note.Generation], "Fence"]) -> None:
    """Install how rank 0's fence is built for a noted round: the launcher's workers do this at start
    (:func:`training.launch.rendezvous.fence.install`), as only the launch room may talk to etcd."""
    global _factory
    _factory = factory


def build(rank: int) -> "Fence":
    """Rank 0 of a group whose agent noted a round, in a worker started by this project's agent (which installed
    the etcd fence, :func:`register`), gets that fence; every other rank, or any other run, a :class:`NoFence`."""
    gen = generation_note.read()
    if rank != 0 or gen is None or _factory is None:
        return NoFence()
    return _factory(gen)

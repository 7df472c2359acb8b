"""The job's known failures, each with its exit code (torch-free, so the entry point imports it cheaply).

Every rank raises these together (the decision is agreed first), so a wrapper can tell from the exit code
whether a rerun can help: 2-5 need a change of settings or data, 6 needs storage fixed, then a rerun resumes; 9
says this worker group was replaced by a newer one (the job goes on there: nothing to rerun).
"""

from __future__ import annotations

import sys

from training.config import ConfigError


def print_error(e: BaseException | str) -> None:
    """Write ``error: <e>`` and its newline to stderr in one write. Workers run with PYTHONUNBUFFERED, where
    ``print`` writes the text and the newline apart, and the agent shares the stream: its own line could land
    between the two and glue itself onto the error."""
    sys.stderr.write(f"error: {e}\n")
    sys.stderr.flush()


class CheckpointIncompatible(RuntimeError):
    """The checkpoint directory holds a checkpoint of a different model; loading it would be wrong."""


class RunChanged(RuntimeError):
    """The newest checkpoint belongs to a run with other settings; the message lists them and the ways on."""


class Diverged(RuntimeError):
    """Training produced non-finite values; nothing non-finite was checkpointed."""


class CheckpointStorageError(RuntimeError):
    """Checkpoints cannot be written (no space, read-only, permissions); the message says why and where."""


class StaleGroup(RuntimeError):
    """This worker group's rendezvous round was replaced by a newer one (its agent lost the membership store while
    spares formed a new group): the commit fence refused its checkpoint (training.checkpoint.fence), and every
    rank stops at the next step boundary rather than train on beside the group that replaced it."""


class PeerLost(RuntimeError):
    """A checkpoint collective lost a peer (silent, hung or gone): not a storage problem. Deliberately without
    an exit code: the worker crashes like one whose training collective lost a peer, and the launcher restarts
    the group from the newest complete checkpoint."""


class Regroup(RuntimeError):
    """Every rank stops at this step boundary so the group re-forms without a node (a straggler taken out while a
    hot spare waits, :mod:`training.job.stragglers`). Not in EXIT_CODES: its exit code (8) is not a failure the
    agent passes on but one it restarts from (the snapshot of this step), and it says nothing as an error."""

    exit_code = 8


class PeerTakenOut(Regroup):
    """A straggler's node leaves at this step boundary and this rank is not on it. Without ``failover.in_place`` it
    is a :class:`Regroup` like any (every rank stops, exit code 8); an in-place job catches it instead
    (:meth:`training.job.failover.InPlace.peer_lost`) and this rank recovers in place, keeping its process, while
    the spare's workers take the straggler's ranks."""


EXIT_CODES: dict[type[Exception], int] = {
    ConfigError: 2,
    CheckpointIncompatible: 3,
    RunChanged: 4,
    Diverged: 5,
    CheckpointStorageError: 6,
    StaleGroup: 9,  # 7: a busy checkpoint.dir (training.checkpoint.run_lock), 8: Regroup
}


def exit_code(e: BaseException, known: dict[type[BaseException], int] | None = None) -> int | None:
    """The exit code of ``e``'s kind (a subclass counts: a DataSourceError is a ConfigError), or None."""
    table = EXIT_CODES if known is None else known
    for kind in type(e).__mro__:
        if kind in table:
            return table[kind]
    return None

"""One run per checkpoint directory: a lock that a crashed run cannot leave stuck.

Two jobs on the same ``checkpoint.dir`` overwrite each other's checkpoints and each resumes from the
other's steps. Rank 0 of every worker-group incarnation therefore holds ``fcntl.flock(LOCK_EX | LOCK_NB)``
on ``<checkpoint.dir>/.t5-failover.lock`` (:class:`RunLock`, taken in ``Trainer.__init__`` through
:func:`lock_for_job`). A flock belongs to the open file, and the kernel (or the file server) drops it when
the last descriptor closes, so a run that is SIGKILLed or crashes releases it with its process; a torchrun
restart starts a new rank 0 that takes it again. The file's content (holder host, pid, start time, run id)
only feeds the error message.

Details that make this hold:

* descriptors are closed in forked children (``os.register_at_fork``): a data-loader worker forked by
  rank 0 must not keep the lock alive after rank 0 died;
* a previous incarnation of the *same* elastic run (same ``TORCHELASTIC_RUN_ID``) may still hold the lock
  for a while after it was stopped: on a shared file system a dead node's locks are only released when the
  server evicts it. :func:`lock_for_job` waits for those, up to a bound; another run fails at once;
* file systems without flock (a Lustre client mounted without ``-o flock``: ENOSYS; some NFS setups:
  ENOLCK; EOPNOTSUPP) get one warning and no lock: training must not depend on an optional feature.

``python -m training.launch`` (local runs) and ``python -m training.launch.agent --standalone`` check the
lock with :meth:`RunLock.check` before starting anything, so a busy directory fails in a second with
:data:`EXIT_BUSY` instead of after a worker group has started. No torch import here: the launcher uses it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("training")
LOCK_NAME = ".t5-failover.lock"
#: Exit code of ``python -m training`` (and of the launchers' checks) when checkpoint.dir is in use.
EXIT_BUSY = 7
_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)
_held_fds: set[int] = set()
_warned_unsupported = False


def _close_in_child() -> None:
    # A forked child (data-loader worker) shares the open file: keeping it open would keep the lock alive
    # after rank 0 dies. Closing (not unlocking) drops only the child's reference.
    for fd in _held_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_in_child)


class CheckpointDirBusy(RuntimeError):
    """Another run holds the checkpoint directory; the message names it, the holder and the fix."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lock, as the holder wrote it into the lock file."""

    host: str
    pid: int
    started: float
    run: str = ""

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, since {since}" + (f", run {self.run}" if self.run else "")


class RunLock:
    """The exclusive lock on one checkpoint directory (see the module docstring).

    Args:
        directory: the checkpoint directory (created by :meth:`acquire` if missing).
        run: the elastic run id of this job (``TORCHELASTIC_RUN_ID``), recorded for other runs to read.
    """

    def __init__(self, directory: str | os.PathLike, run: str = ""):
        self.dir = Path(directory)
        self.path = self.dir / LOCK_NAME
        self.run = run
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_same_run_s: float = 0.0) -> bool:
        """Take the lock; True when held, False when the file system has no locks (warned once).

        Raises :class:`CheckpointDirBusy` when another process holds it. A holder that recorded this run's
        id (a previous incarnation of this job, stopped or lost) is waited for up to ``wait_same_run_s``.
        """
        if self._fd is not None:
            return True
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline, told = time.monotonic() + wait_same_run_s, False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = self.holder()
                    same_run = bool(self.run) and holder is not None and holder.run == self.run
                    if not same_run or time.monotonic() >= deadline:
                        raise CheckpointDirBusy(self._busy_message(holder)) from None
                    if not told:
                        log.warning(
                            f"checkpoint.dir {self.dir} is still locked by a previous incarnation of this "
                            f"run ({holder.describe()}); waiting up to {wait_same_run_s:.0f} s for it to "
                            f"be released"
                        )
                        told = True
                    time.sleep(0.5)
        except OSError as e:
            os.close(fd)
            if e.errno in _UNSUPPORTED:
                _warn_unsupported(self.dir, e)
                return False
            raise
        except BaseException:
            os.close(fd)
            raise
        me = Holder(socket.gethostname(), os.getpid(), time.time(), self.run)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me.__dict__) + "\n").encode(), 0)
        self._fd = fd
        _held_fds.add(fd)
        return True

    def release(self) -> None:
        """Give the lock up (idempotent). Process exit releases it too."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _held_fds.discard(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def check(self) -> None:
        """Raise :class:`CheckpointDirBusy` if a run holds the lock now; takes and keeps nothing.

        Creates nothing either: without a lock file, nobody holds it.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no lock file (nobody holds it), or no directory: the job's own checks say why
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise CheckpointDirBusy(self._busy_message(self.holder())) from None
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
        finally:
            os.close(fd)

    def holder(self) -> Holder | None:
        """The holder recorded in the lock file (None if unreadable or not written yet)."""
        try:
            return Holder(**json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _busy_message(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "a process that has not written its details yet"
        return (
            f"checkpoint.dir {self.dir} is in use by another run ({who}): stop that run, or give this one "
            f"another --checkpoint.dir (or --job.out_dir)"
        )

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _warn_unsupported(directory: Path, e: OSError) -> None:
    global _warned_unsupported
    if not _warned_unsupported:
        _warned_unsupported = True
        log.warning(
            f"WARNING: the file system of {directory} does not support flock ({os.strerror(e.errno)}): "
            f"training continues without the one-run-per-checkpoint.dir lock (Lustre: mount with -o flock)"
        )


def lock_for_job(directory: str, rank: int, wait_same_run_s: float) -> RunLock | None:
    """Rank 0 takes the lock on ``directory``; every rank raises the same :class:`CheckpointDirBusy` if busy.

    Collective over the default process group (``broadcast_object_list``). Returns the held lock on rank 0
    (None on other ranks, or where the file system has no locks).
    """
    import torch.distributed as dist  # deferred: the launcher imports this module without torch

    from training.errors import CheckpointStorageError
    from training.checkpoint.integrity import storage_reason

    lock, error = None, [("", "")]
    if rank == 0:
        lock = RunLock(directory, run=os.environ.get("TORCHELASTIC_RUN_ID", ""))
        try:
            if not lock.acquire(wait_same_run_s):
                lock = None
        except CheckpointDirBusy as e:
            lock, error = None, [("busy", str(e))]
        except OSError as e:  # read-only, no permission, no space: the same error the storage check gives
            lock, error = (
                None,
                [
                    (
                        "storage",
                        f"checkpoint.dir {directory} is not writable: {storage_reason(e)}; "
                        "point --checkpoint.dir at a writable directory",
                    )
                ],
            )
    dist.broadcast_object_list(error, src=0)
    kind, message = error[0]
    if kind == "busy":
        raise CheckpointDirBusy(message)
    if kind == "storage":
        raise CheckpointStorageError(message)
    return lock


def lock_alone(directory: str, wait_same_run_s: float) -> RunLock | None:
    """Take the lock in this process alone, not as a collective: a rank 0 that joined a running job (its holder, the
    rank 0 before, was lost with its process) or became rank 0 in an in-place recovery. The lost holder's lock is
    waited for up to ``wait_same_run_s`` as at any restart of the same run; another run's raises
    :class:`CheckpointDirBusy` (two runs must not share the directory). None where the file system has no locks."""
    lock = RunLock(directory, run=os.environ.get("TORCHELASTIC_RUN_ID", ""))
    return lock if lock.acquire(wait_same_run_s) else None

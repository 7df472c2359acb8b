"""Wake an agent the moment one of its workers ends, instead of at its next look.

torchrun's monitor loop sleeps ``--monitor-interval`` (0.1 s) between two looks at its workers, so a worker's
death is seen 0-0.1 s late (0.11-0.12 s measured in ``worker-kill-in-place``). In a ``failover.in_place`` job that
wait is on the critical path of every recovery: the survivors learn of the death at once from their failed
collective, then wait for the replacement the agent starts only once it has looked.

:class:`WorkerExits` waits for whichever comes first, the look's interval or the end of one of the given processes,
through Linux's pidfd (``os.pidfd_open``, Linux 5.3): a pidfd becomes readable when its process ends, without reaping
it, so torch's process context still collects the exit status as before. Where pidfds are not available it sleeps
the interval, torch's own behaviour::

    exits = WorkerExits()
    exits.wait(pids, 0.1)   # returns at once when one of pids ends, else after 0.1 s
    exits.close()

Another thread can end a wait early with :meth:`WorkerExits.wake` (the agent's watch of the board's reports of
lost processes and nodes: a worker blocked by a lost node is asked to cut its group at once, not at the next look).

A process seen ended is not waited on again: its exit status reaches torch through its own channel (with the
``forkserver`` start method, the forkserver reaps it and writes the status: measured 0-0.1 s later on a busy
2-core machine), so until torch collects it the wait is short (``SOON_S``), for at most one interval, then the
interval again (no spinning on a readable pidfd).
"""

from __future__ import annotations

import os
import select
import time
from typing import Iterable

#: How long a wait lasts while a process seen ended has not been collected by torch yet.
SOON_S = 0.005


class WorkerExits:
    """See the module docstring. One agent loop waits; :meth:`wake` may come from any thread."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> its open pidfd
        self._ended: dict[int, float] = {}  # pid whose end was seen -> when (monotonic; not waited on again)
        self._available = hasattr(os, "pidfd_open")
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        """End the current (or the next) wait now; from any thread."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):  # full: a wake is pending already; closed: nothing waits any more
            pass

    def _drain_wakes(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, OSError):  # empty
            pass

    def wait(self, pids: Iterable[int], timeout: float) -> set[int]:
        """Wait at most ``timeout`` seconds, less when one of ``pids`` ends or :meth:`wake` is called; returns the
        pids seen ending (empty on the timeout, a wake, or where pidfds are not available)."""
        asked, now = set(pids), time.monotonic()
        self._ended = {pid: at for pid, at in self._ended.items() if pid in asked}  # a reused pid: another process
        if any(now - at < timeout for at in self._ended.values()):
            timeout = min(SOON_S, timeout)  # one seen ended and not collected yet: look again soon
            fds: dict[int, int | None] = {}
        else:
            fds = self._open(asked - set(self._ended))  # {}: none to watch, or no pidfds here (a plain wait)
        ended = {pid for pid, fd in fds.items() if fd is None}  # gone before it could be opened
        if not ended:
            ready, _, _ = select.select([self._wake_r, *(fd for fd in fds.values())], [], [], timeout)
            if self._wake_r in ready:
                self._drain_wakes()
            ended = {pid for pid, fd in fds.items() if fd in ready}
        self._ended.update((pid, time.monotonic()) for pid in ended)
        return ended

    def _open(self, pids: set[int]) -> dict[int, int | None]:
        """The pidfd of each pid (None: the process is gone already); those no longer asked for are closed. Empty
        where pidfds are not available here (no ``os.pidfd_open``, or a kernel older than 5.3)."""
        for pid in set(self._fds) - pids:
            os.close(self._fds.pop(pid))
        fds: dict[int, int | None] = {}
        if not self._available:
            return fds
        for pid in pids:
            if pid not in self._fds:
                try:
                    self._fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    fds[pid] = None
                    continue
                except OSError:  # ENOSYS (kernel < 5.3), EPERM under some sandboxes: torch's plain sleep
                    self._available = False
                    self.close()
                    return {}
            fds[pid] = self._fds[pid]
        return fds

    def close(self) -> None:
        """Close the pidfds (a later wait opens them again); the wake pipe stays for the object's life."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        for fd in (getattr(self, "_wake_r", None), getattr(self, "_wake_w", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

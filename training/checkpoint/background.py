"""Where an async storage save is written while training goes on: a thread of the training process, or a process
of its own (checkpoint.writer).

Both stage the state into host buffers allocated once and reused by every save
(:class:`~training.checkpoint.staging.ReusedBufferStager`), then write it with DCP in the background and hand back
a future the storage writer commits from. ``thread`` is DCP's own ``async_save`` (its writer thread shares the
training process's interpreter lock); ``process`` sends the staged buffers (shared memory: only their handles
travel) to the rank's writer process (:mod:`~training.checkpoint.write_process`), started once when the tier is
built, so neither its start nor the write's Python work lands on a step.

    writes = start_writes("process", site, stager)   # collective: every rank, at start
    future = writes.save(state, path, timeout_s)     # stages now, writes in the background
    writes.close()                                   # the writer process ends (after the save in flight)
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from training.checkpoint.staging import ReusedBufferStager
from training.checkpoint.storage_site import StorageSite
from training.checkpoint.step_writer import StepDirWriter
from training.checkpoint.write_process import rebuilt, serve


#: Signals a job's processes get that only the trainer acts on (it checkpoints, then stops its writer).
TRAINER_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}

#: How long close() waits for the writer process to end before it is killed.
STOP_WAIT_S = 10.0


class InThread:
    """DCP's async_save: the write runs on a thread of the training process."""

    def __init__(self, site: StorageSite, stager: ReusedBufferStager):
        self.site, self.stager = site, stager

    def prepare(self, state: dict[str, Any]) -> None:
        _allocate(self.stager, state)

    def save(self, state: dict[str, Any], path: str, timeout_s: float) -> Future:
        writer = StepDirWriter(path)
        return dcp.async_save(state, storage_writer=writer, process_group=self.site.group, async_stager=self.stager)

    def take_start_wait(self) -> float:
        """Seconds the last write waited for its writer to start: none, a thread starts at once."""
        return 0.0

    def abandon(self) -> None:
        """Nothing of its own to stop: DCP's thread ends when its collectives fail (the recovery cuts the old
        group's connections, training.job.inplace.group.InPlaceGroup.cut_left_over)."""

    def close(self) -> None:
        """Nothing of its own to end: DCP's thread ends with the save."""


class InProcess:
    """The rank's writer process: started here (collective: rank 0 picks the writers' group address), ready by the
    first save, which waits for it if it is not; ended by :meth:`close` or with the training process."""

    def __init__(self, site: StorageSite, stager: ReusedBufferStager):
        self.site, self.stager = site, stager
        # Rank 0 binds the writers' port here and hands the listening socket to its writer: a port only picked
        # here and bound later by the writer could be taken by another process in between (EADDRINUSE).
        listener = _writers_listener() if site.rank == 0 else None
        addr, port = site.agree(_writers_address(listener) if listener is not None else None)
        self.address = (addr, port)  # the writers' group's store: rank 0's writer serves it
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_end = ctx.Pipe()
        self.process = ctx.Process(
            target=serve,
            args=(child_end, os.getpid(), site.rank, site.world_size, addr, port, site.cfg.timeout_s, listener),
            name=f"t5f-writer-{site.rank}",
            daemon=True,
        )
        # Born with the job's signals blocked (a child inherits the mask of the thread that starts it): a Ctrl-C
        # or SIGTERM for the job reaches the trainer, which finishes the save in flight and then stops its writer.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, TRAINER_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if listener is not None:
                listener.close()  # the writer holds its own copy of the socket now
        child_end.close()  # the writer's end lives in the writer: a recv here fails at once if it dies
        self._ready = False
        self._start_wait_s = 0.0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="t5f-writer-pipe")
        # Before multiprocessing's own exit handler (which would SIGTERM a child that blocks it, then wait forever).
        atexit.register(self.close)

    def prepare(self, state: dict[str, Any]) -> None:
        _allocate(self.stager, state)

    def save(self, state: dict[str, Any], path: str, timeout_s: float) -> Future:
        staged = _stage(self.stager, state)
        return self._thread.submit(self._write, path, staged, timeout_s)

    def _write(self, path: str, staged: dict[str, Any], timeout_s: float) -> None:
        if not self._ready:
            t0 = time.perf_counter()
            self._expect("ready")
            self._ready = True
            self._start_wait_s = time.perf_counter() - t0
        self._conn.send(("save", path, staged, timeout_s))
        self._expect("done")

    def take_start_wait(self) -> float:
        """Seconds the last write waited for the writer process to start (once: a save that came before it was
        ready); not part of how long a save takes, which bounds the checkpoint collectives."""
        waited, self._start_wait_s = self._start_wait_s, 0.0
        return waited

    def _expect(self, what: str) -> None:
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(1.0)
            raise RuntimeError(
                f"the background writer process (pid {self.process.pid}) ended, exit code {self.process.exitcode}"
            ) from None
        if reply[0] == "failed":
            raise rebuilt(reply[1])
        if reply[0] != what:
            raise RuntimeError(f"the background writer process answered {reply[0]!r}, not {what!r}")

    def abandon(self) -> None:
        """The save in flight is let go (an in-place recovery: its collectives are with the old group's writers,
        one of them maybe gone or silent): kill the writer now, so the save ends at once (its step is never
        committed) instead of at its collectives' timeout, holding this process's pipe thread, which a worker's
        exit joins."""
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        """End the writer process (the storage writer has waited for the save in flight): asked, else killed."""
        atexit.unregister(self.close)
        self._thread.shutdown(wait=True)
        if self.process.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self.process.join(STOP_WAIT_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        self._conn.close()


def _state_dicts(state: dict[str, Any]) -> dict[str, Any]:
    """The state as DCP saves it: the Stateful entries' state dicts."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}


def _allocate(stager: ReusedBufferStager, state: dict[str, Any]) -> None:
    """The stager's buffers for the state, nothing copied (a copy before the first save is thrown away by it)."""
    stager.allocate(_state_dicts(state))


def _stage(stager: ReusedBufferStager, state: dict[str, Any]) -> dict[str, Any]:
    """The state's copy in the stager's buffers (the Stateful entries' state dicts, as DCP saves them)."""
    return stager.stage(_state_dicts(state))


def _writers_listener() -> socket.socket:
    """Rank 0: the writers' group's listening socket on a port free now, held until its writer takes it over."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", 0))
    sock.listen(socket.SOMAXCONN)
    return sock


def _writers_address(listener: socket.socket) -> tuple[str, int]:
    """Where the writers' group meets (rank 0's writer hosts it): this node's address as the job knows it
    (MASTER_ADDR, the host of rank 0) and the listener's port."""
    return os.environ.get("MASTER_ADDR", "127.0.0.1"), listener.getsockname()[1]


def start_writes(kind: str, site: StorageSite, stager: ReusedBufferStager) -> InThread | InProcess:
    """Collective when `kind` is 'process' (checkpoint.writer)."""
    return InProcess(site, stager) if kind == "process" else InThread(site, stager)

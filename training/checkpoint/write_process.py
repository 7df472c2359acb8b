"""The writer process's own side: one per rank, started once at start, it writes async storage saves with DCP.

Why a process: a writer thread shares the training process's interpreter lock, and steps ran 2.2x slower while
it wrote (H200, 0.94 s vs 0.42 s). Here the training process stages the state into shared-memory buffers it
reuses, sends their handles over a pipe, and this process runs ``dcp.save`` on them with its own gloo group (the
writers of all ranks; same ranks as the training world) while training goes on.

It never outlives its trainer: it stops when told, when the pipe closes (the trainer exited while it was idle),
and within WATCH_S when the trainer's process is gone mid-save (SIGKILL); a partly written step directory has no
commit marker and is never loaded. The signals a job's processes receive (Ctrl-C, SIGTERM, Slurm's SIGUSR1) are
blocked here from birth: the trainer decides when its writer stops, after the save in flight.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

#: How often the writer looks whether its trainer still lives.
WATCH_S = 0.2


def portable(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions inside it (DCP's per-rank failures, causes) as plain ones that pickle, keeping what
    the failure's words are made of (:mod:`training.checkpoint.integrity`): an OSError's errno and file, the text."""
    from training.checkpoint.integrity import _errors

    out: list[BaseException] = []
    for e in _errors(exc):
        if isinstance(e, OSError) and e.errno is not None:
            out.append(OSError(e.errno, e.strerror or str(e), e.filename))
        else:
            out.append(RuntimeError(str(e) or type(e).__name__))
    return out


def rebuilt(parts: list[BaseException]) -> BaseException:
    """The exception :func:`portable` took apart, chained (each the cause of the one before)."""
    for outer, inner in zip(parts, parts[1:]):
        outer.__cause__ = inner
    return parts[0]


def _watch_trainer(trainer_pid: int) -> None:
    while os.getppid() == trainer_pid:
        time.sleep(WATCH_S)
    os._exit(1)  # the trainer is gone (SIGKILL mid-save): the step it was writing is never committed


def serve(conn, trainer_pid: int, rank: int, world: int, addr: str, port: int, timeout_s: float, listener=None) -> None:
    """The writer process: join the writers' group, say ready, then write each requested save until told to stop.

    Requests: ("save", path, staged_state, timeout_s) -> ("done",) or ("failed", portable exception parts);
    ("stop",) ends it. ``listener``: rank 0's listening socket on ``port`` (bound by its trainer, so the port
    agreed with the other ranks is never taken by another process before this writer serves it); None elsewhere."""
    # The job's signals are the trainer's to handle (it finishes the save in flight, then stops this writer). The
    # writer is started with them blocked, but the mask did not survive the spawn everywhere (a run here found only
    # SIGUSR1 still blocked), so they are ignored here too.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_watch_trainer, args=(trainer_pid,), name="t5f-writer-watch", daemon=True).start()
    logging.getLogger().setLevel(logging.WARNING)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from training.checkpoint.step_writer import StepDirWriter

    try:
        # The writers' own store, hosted by rank 0's writer: never the launcher's (a worker's environment says to use
        # torchrun's agent store, where the writers would all wait as clients of a store nobody hosts).
        wait = timedelta(seconds=timeout_s)
        if listener is not None:  # the store owns the socket from here on (it closes it)
            store = dist.TCPStore(addr, port, world, is_master=True, timeout=wait, master_listen_fd=listener.detach())
        else:
            store = dist.TCPStore(addr, port, world, is_master=False, timeout=wait)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which names it
        conn.send(("failed", portable(e)))
        return
    conn.send(("ready",))
    bound = timeout_s
    try:
        while True:
            try:
                request: Any = conn.recv()
            except EOFError:  # the trainer is gone (exited or killed) while this writer was idle: nothing to tidy,
                os._exit(0)  # and a group teardown could wait on peers that are gone too
            if request[0] == "stop":
                return
            _, path, staged, wait_s = request
            try:
                if wait_s != bound:  # the trainer's bound for checkpoint collectives (see StorageWriter)
                    dist.group.WORLD.set_timeout(timedelta(seconds=wait_s))
                    bound = wait_s
                dcp.save(staged, storage_writer=StepDirWriter(path))
                reply: tuple = ("done",)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the trainer, this writer stays
                reply = ("failed", portable(e))
            del staged, request  # the shared buffers' handles: let them go before the next save is staged
            conn.send(reply)
    finally:
        conn.close()
        dist.destroy_process_group()

"""TensorBoard event files of a run, written from the records ``metrics.jsonl`` gets, off the training thread.

    board = TensorBoardLog.build(cfg.metrics, enabled=rank == 0)   # a NullLog when off or not rank 0
    board.record({"event": "step", "time": ..., "step": 3, "loss": ...})   # never blocks: a queue
    board.close()                                               # flushes (bounded wait)

:class:`training.job.metrics.MetricsLogger` (rank 0) hands every record it writes to its board, so the trainer has
no TensorBoard code. A background thread owns torch's ``SummaryWriter`` (the ``tensorboard`` package) and writes,
per step: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``perf/tokens_per_s``, ``perf/step_time_s``,
``perf/ckpt_block_s``, ``perf/snapshot_block_s``, ``job/world_size``, ``job/snapshot_interval`` (the in-memory
snapshot interval in effect, 0 = off) (and ``perf/mfu`` where a record has it: GPU runs that measure it); per
attempt: ``job/restarts`` at the step it resumed from, a ``job/events`` text (attempt started: resumed from,
restored from which tier, world size; an attempt that ended other than finished: how; the snapshot interval
memory_interval=auto chose, and each change, or a fixed one over its budget) and, for an attempt that follows a
failure (its agent restarted it), ``job/failures`` (1 at that step). Records carry their wall time.

A resumed attempt opens its writer with ``purge_step`` = the step after the one it resumed from, so TensorBoard
hides what the failed attempt logged beyond it: the curves show the steps the weights contain once. Each attempt
writes its own event file in the same directory. A queue that fills (the disk stalls) drops records and says so
once; a writer that fails says so once and stops: the JSONL file stays the record of truth, training goes on.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Any

from training.config import MetricsConfig

#: step-record fields -> TensorBoard tags
STEP_SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "step_time_s": "perf/step_time_s",
    "ckpt_block_s": "perf/ckpt_block_s",
    "snapshot_block_s": "perf/snapshot_block_s",
    "world_size": "job/world_size",
    "snapshot_interval": "job/snapshot_interval",
    "mfu": "perf/mfu",
}
QUEUE_SIZE = 10_000
CLOSE_WAIT_S = 10.0


class NullLog:
    """metrics.tensorboard off, or not rank 0: takes records and does nothing."""

    def record(self, rec: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardLog:
    """Writes records to TensorBoard event files in ``directory`` on its own thread (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self._dropped = 0
        self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
        self._thread.start()

    @classmethod
    def build(cls, cfg: MetricsConfig, *, enabled: bool = True) -> "TensorBoardLog | NullLog":
        """The board of ``cfg`` (its ``tensorboard_dir``, else ``tensorboard/`` beside ``metrics.path``), or a
        NullLog when ``enabled`` is False (not rank 0) or ``metrics.tensorboard`` is off."""
        if not (enabled and cfg.tensorboard):
            return NullLog()
        return cls(cfg.tensorboard_dir or os.path.join(os.path.dirname(os.path.abspath(cfg.path)), "tensorboard"))

    def record(self, rec: dict[str, Any]) -> None:
        """Queue one metrics record (any thread); when the queue is full the record is dropped, never waited on."""
        try:
            self._queue.put_nowait(rec)
        except queue.Full:
            self._dropped += 1
            if self._dropped == 1:
                _warn(
                    f"TensorBoard writer in {self.directory} is behind ({QUEUE_SIZE} records queued): records are "
                    "dropped from its event files until it catches up (metrics.jsonl has them all)"
                )

    def close(self) -> None:
        """Write what is queued and close the event file (waits at most CLOSE_WAIT_S)."""
        try:
            self._queue.put(None, timeout=CLOSE_WAIT_S)
        except queue.Full:
            return
        self._thread.join(CLOSE_WAIT_S)

    # ---- the writer thread
    def _run(self) -> None:
        writer = None
        try:
            while True:
                rec = self._queue.get()
                if rec is None:
                    break
                if writer is None:
                    writer = self._open(rec)
                self._write(writer, rec)
                if self._queue.empty():
                    writer.flush()
        except Exception as e:  # noqa: BLE001 - a full disk, a broken directory: say so, keep training
            _warn(
                f"TensorBoard event files in {self.directory} can no longer be written ({e}); training "
                "continues, metrics.jsonl has every record"
            )
            while self._queue.get() is not None:  # let producers go on queueing without blocking
                pass
        finally:
            if writer is not None:
                try:
                    writer.close()
                except Exception:  # noqa: BLE001 - already reported above, or closing a writer that failed
                    pass

    def _open(self, first: dict[str, Any]):
        # Imported here, on this thread: the tensorboard package's import never delays the training thread.
        from torch.utils.tensorboard import SummaryWriter

        resumed = first.get("resumed_from") if first.get("event") == "start" else None
        return SummaryWriter(log_dir=self.directory, purge_step=resumed + 1 if resumed else None, flush_secs=5)

    @staticmethod
    def _write(w, rec: dict[str, Any]) -> None:
        ev, t = rec.get("event"), rec.get("time")
        if ev == "step":
            for key, tag in STEP_SCALARS.items():
                value = rec.get(key)
                if isinstance(value, (int, float)):
                    w.add_scalar(tag, value, rec["step"], walltime=t)
        elif ev == "start":
            step, restarts = rec.get("resumed_from") or 0, rec.get("restart_count") or 0
            w.add_scalar("job/restarts", restarts, step, walltime=t)
            if restarts:  # its agent restarted the group: a worker failed or the membership changed
                w.add_scalar("job/failures", 1, step, walltime=t)
            tier = (rec.get("restored_from") or {}).get("tier")
            w.add_text(
                "job/events",
                f"attempt {restarts} started at world size {rec.get('world_size')}, "
                + (f"resumed from step {step} ({tier})" if step else "from the beginning"),
                step,
                walltime=t,
            )
        elif ev == "end" and rec.get("status") not in ("finished", "already_finished"):
            detail = f": {rec['detail']}" if rec.get("detail") else ""
            w.add_text(
                "job/events",
                f"attempt ended at step {rec.get('step')}: {rec.get('status')}{detail}",
                rec.get("step") or 0,
                walltime=t,
            )
        elif ev == "snapshot_interval" and rec.get("detail"):  # what memory_interval chose, or a fixed one's cost
            w.add_text("job/events", str(rec["detail"]), rec.get("step") or 0, walltime=t)
        elif ev == "signal":
            w.add_text(
                "job/events", f"{rec.get('signal')} received: checkpoint and stop", rec.get("step") or 0, walltime=t
            )


def _warn(line: str) -> None:
    try:
        print(f"WARNING: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass

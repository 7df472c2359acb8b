"""Rank-0 progress lines, a closing summary, and per-step metrics as JSONL (appended across restarts); every
record also goes to the run's TensorBoard event files (:mod:`training.job.tensorboard`, when on) and, on a
Kubeflow Trainer with the TrainJobStatus feature, to the TrainJob's status (:mod:`training.job.trainer_status`)."""

from __future__ import annotations

import errno
import json
import os
import statistics
import sys
import time
from typing import Any

from training.config import MetricsConfig
from training.job.tensorboard import TensorBoardLog
from training.job.trainer_status import TrainerStatus

WARMUP_STEPS = 1  # an attempt's first step pays one-time costs (allocator, caches): not in the ETA


class MetricsLogger:
    """Writes one JSON object per line with an "event" field; does nothing on ranks other than 0.

    Every attempt ends with exactly one ``end`` event (``status``: finished, already_finished, signal, error)
    carrying its summary, and the same summary as one printed line."""

    def __init__(self, cfg: MetricsConfig, *, rank: int, total_steps: int):
        self.cfg, self.enabled, self.total_steps = cfg, rank == 0, total_steps
        self._fd: int | None = None  # metrics.path, opened for appending (rank 0)
        self._step_times: list[float] = []
        self._t0 = time.time()
        self._steps = self._tokens = 0
        self._loss: float | None = None
        self._last_step = 0
        self._ended = False
        if self.enabled:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.path)), exist_ok=True)
            self._fd = os.open(cfg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # the same records, off the training thread: TensorBoard event files, the TrainJob's status (EKS)
        self.board = TensorBoardLog.build(cfg, enabled=self.enabled)
        self.trainer_status = TrainerStatus.build(cfg, enabled=self.enabled, total_steps=total_steps)

    def event(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        record = {"event": event, "time": time.time(), **fields}
        self.board.record(record)
        self.trainer_status.record(record)
        line = (json.dumps(record) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, line)  # one append; a short one means the file system is full
            if written != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            # The disk filled or failed after the start checks passed: the metrics are a record, the checkpoints
            # are the work. Take back a partial line (readers and later appends need whole lines), say so once
            # and train on; a checkpoint that cannot be written stops the run with its own reason.
            try:
                os.ftruncate(self._fd, end)
            except OSError:
                pass
            self._say(
                f"WARNING: metrics.path {self.cfg.path} can no longer be written ({e.strerror or e}); "
                "no more metrics lines are recorded in this attempt, training continues"
            )
            self.close()

    def eta_s(self) -> float | None:
        """Median step time of this attempt (warm-up excluded) x steps left; None until one step is known."""
        times = self._step_times[WARMUP_STEPS:]
        if not times:
            return None
        return statistics.median(times[-20:]) * (self.total_steps - self._last_step)

    def step(self, **m: Any) -> None:
        self._steps += 1
        self._tokens += int(m.get("tokens", 0))
        self._loss, self._last_step = m["loss"], m["step"]
        self._step_times.append(m["step_time_s"])
        if not self.enabled:
            return
        self.event("step", **m)
        if m["step"] % self.cfg.log_every == 0 or m["step"] == self.total_steps:
            eta = self.eta_s()
            self._say(
                f"step {m['step']:>6}/{self.total_steps} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | "
                f"{m['tokens_per_s']:,.0f} tok/s | {m['step_time_s']:.2f} s/step | "
                f"ckpt {m['ckpt_block_s']:.2f} s | world {m['world_size']} | "
                f"ETA {'-' if eta is None else f'{eta:,.0f} s'}"
            )

    def end(self, status: str, step: int, detail: str = "") -> None:
        """The attempt's closing `end` event and summary line (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        wall = time.time() - self._t0
        busy = sum(self._step_times)
        summary = {
            "status": status,
            "step": step,
            "steps_this_attempt": self._steps,
            "wall_s": round(wall, 3),
            "tokens_this_attempt": self._tokens,
            "tokens_per_s": round(self._tokens / busy, 1) if busy else None,
            "final_loss": self._loss,
        }
        self.event("end", **summary, **({"detail": detail} if detail else {}))
        if self.enabled:
            rate = f"{summary['tokens_per_s']:,.0f} tok/s mean" if busy else "no steps"
            loss = f"final loss {self._loss:.4f}" if self._loss is not None else "no loss"
            self._say(
                f"summary: {status} at step {step}/{self.total_steps} | {self._steps} step(s) in {wall:,.1f} s | "
                f"{rate} | {loss} | {self._tokens:,} tokens this attempt"
            )

    def info(self, msg: str) -> None:
        if self.enabled:
            self._say(msg)

    @staticmethod
    def _say(line: str) -> None:
        try:
            print(line, flush=True)
        except BrokenPipeError:
            # Whoever read our output is gone (a launcher killed with SIGKILL, `| head`): the console is best
            # effort, the JSONL file and the checkpoints are not, and a stop must not turn into a crash here.
            # Later output goes to /dev/null (as the Python docs advise: no error at exit either).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.board.close()
        self.trainer_status.close()

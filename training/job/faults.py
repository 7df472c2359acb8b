"""Fault injection for tests and chaos runs: one object the job calls at named points, doing nothing unless a
``fault.*`` setting is on (:class:`training.config.FaultConfig`). Production code has no fault ``if`` of its own.

The points, in the order a step meets them::

    faults.mid_step(step)              # the step's batch is agreed, its forward pass not begun (wedge)
    faults.loss(step, loss)            # the step's loss (NaN at fault.nan_at_step)
    faults.mid_snapshot(step)          # halfway through copying the in-memory snapshot (fail / SIGKILL)
    faults.during_save(step)           # a checkpoint save, once its directory is agreed (SIGSTOP)
    faults.before_commit(step)         # a checkpoint's data written, its commit marker not yet (sleep)
    faults.after_step(step)            # the step is done and recorded (SIGKILL, SIGSTOP, sleep, hold)

A fault that ends or stops the process happens once per ``job.out_dir`` (a marker file there), so the restarted
job does not repeat it.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Callable

from training.config import FaultConfig


def _at(setting: int, step: int) -> bool:
    """A fault.*_at_step setting fires at its step; 0 is off."""
    return setting > 0 and setting == step


class Faults:
    """The injected faults of one rank. ``enabled`` is False when no fault.* setting is on."""

    def __init__(self, cfg: FaultConfig, *, rank: int, out_dir: str, interrupted: Callable[[], bool] = lambda: False):
        """``interrupted``: whether this rank was asked to stop (SIGTERM from its agent): a hold ends then, so
        that the rank reaches its next step boundary and stops there as it would unheld."""
        self.cfg, self.rank, self.out_dir = cfg, rank, Path(out_dir)
        self._interrupted = interrupted
        defaults = FaultConfig()
        self.enabled = any(getattr(cfg, f.name) != getattr(defaults, f.name) for f in fields(cfg) if f.name != "rank")
        self._mine = rank == cfg.rank  # the faults aimed at one rank hit fault.rank only

    def mid_step(self, step: int) -> None:
        """Before the forward pass of `step`: block this rank's main thread for good at fault.wedge_at_step (once
        per out_dir). Only the main thread: the process and its heartbeat thread run on."""
        if self._mine and _at(self.cfg.wedge_at_step, step) and self._mark_once(f"wedge-step{step}"):
            print(
                f"[fault] rank {self.rank} blocks its main thread at the start of step {step}'s forward pass "
                f"(pid {os.getpid()}; its heartbeat thread runs on)",
                flush=True,
            )
            threading.Event().wait()  # never set: a wedged main loop

    def loss(self, step: int, loss):
        """The loss as computed, or NaN times it at fault.nan_at_step (every rank)."""
        return loss * float("nan") if _at(self.cfg.nan_at_step, step) else loss

    def mid_snapshot(self, step: int) -> None:
        """Halfway through the in-memory snapshot copy of `step`: an injected 'no space' error, or SIGKILL."""
        if not self._mine:
            return
        if _at(self.cfg.fail_snapshot_at_step, step):
            raise OSError(errno.ENOSPC, f"[fault] injected: no space for the memory snapshot of step {step}")
        if _at(self.cfg.kill_in_snapshot_at_step, step):
            self._signal_self_once(
                f"snapshot-kill-step{step}", f"SIGKILLs itself halfway through the memory snapshot of step {step}"
            )

    def during_save(self, step: int) -> None:
        """At the start of the checkpoint write of `step`: go silent (SIGSTOP) like a node whose sockets stay open."""
        if self._mine and _at(self.cfg.stop_in_save_at_step, step):
            self._signal_self_once(
                f"save-stop-step{step}", f"stops itself (SIGSTOP) in the checkpoint save of step {step}", signal.SIGSTOP
            )

    def before_commit(self, step: int) -> None:
        """Between a checkpoint's data and its commit marker: hold the commit back for fault.slow_commit_s."""
        if self.cfg.slow_commit_s:
            time.sleep(self.cfg.slow_commit_s)

    def ends_process_at(self, step: int) -> bool:
        """Whether :meth:`after_step` may SIGKILL or SIGSTOP a rank after `step` (the same answer on every rank): the
        trainer reads the step figures first, so that the metrics file holds the step's record as before."""
        return any(_at(x, step) for x in (self.cfg.sigkill_at_step, self.cfg.sigkill_after_snapshot_at_step)) or _at(
            self.cfg.stop_at_step, step
        )

    def after_step(self, step: int, snapshot_written: Callable[[], None] = lambda: None) -> None:
        """After `step` is recorded: SIGKILL or SIGSTOP (fault.rank, once; ``snapshot_written`` waits for the step's
        in-memory snapshot, for fault.sigkill_after_snapshot_at_step), the per-step sleep and the hold while
        fault.hold_file exists (every rank)."""
        if self._mine and _at(self.cfg.sigkill_at_step, step):
            self._signal_self_once(f"sigkill-step{step}", f"SIGKILLs itself after step {step}")
        if self._mine and _at(self.cfg.sigkill_after_snapshot_at_step, step):
            snapshot_written()
            self._signal_self_once(f"sigkill-step{step}", f"SIGKILLs itself after step {step} and its snapshot")
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)
        self._hold(step)
        if self._mine and _at(self.cfg.stop_at_step, step):
            self._signal_self_once(f"stop-step{step}", f"stops itself (SIGSTOP) after step {step}", signal.SIGSTOP)

    def _hold(self, step: int) -> None:
        """Wait while fault.hold_file exists (a harness holds the job at this step boundary), unless asked to stop."""
        hold = self.cfg.hold_file
        if not hold or not os.path.exists(hold) or self._interrupted():
            return
        print(f"[fault] rank {self.rank} holds after step {step} while {hold} exists", flush=True)
        while os.path.exists(hold) and not self._interrupted():
            time.sleep(0.1)
        why = "asked to stop" if self._interrupted() else "released"
        print(f"[fault] rank {self.rank} {why} after step {step}", flush=True)

    def _signal_self_once(self, name: str, what: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to this process, once per out_dir (a marker file keeps the restarted job from repeating it)."""
        if not self._mark_once(name):
            return
        print(f"[fault] rank {self.rank} {what}", flush=True)
        os.kill(os.getpid(), sig)

    def _mark_once(self, name: str) -> bool:
        """True the first time `name` is marked in out_dir (the marker holds this pid), False ever after."""
        marker = self.out_dir / f".fault-{name}"
        if marker.exists():
            return False
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        return True

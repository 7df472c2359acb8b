"""A rank's progress: which phase of which step its main thread is in, and how long each phase may take.

The trainer marks each phase boundary (``tracker.enter(phase, step)``: two attribute writes and a clock read).
The heartbeat thread (:mod:`training.job.watchdog`) reads it once a second, publishes it with the beat
(:class:`Heartbeat`) and asks :meth:`ProgressTracker.stall` whether the main thread has been in its phase for
longer than the phase's bound: a *wedged* rank (its process and heartbeat thread alive, its main loop stuck: a
hung read of the shared file system, a call that never returns). Its agent then SIGKILLs it.

Bounds come from what this attempt observed, not from constants:

* a phase seen fewer than ``parallel.wedge_warmup`` times in this attempt (the first steps: allocator, caches,
  compilation; the first save), everything before step 1 (build, rendezvous, checkpoint load), the synchronous
  save of a stop or of the last step and what follows it, may take ``parallel.init_timeout_s``, as the process
  group's own start-up timeout;
* afterwards ``max(floor, parallel.wedge_multiple x the slowest time of that phase seen so far)`` (the first
  time of each is left out: it pays the attempt's one-time costs, and the start-up bound covered it); the floor is
  ``parallel.wedge_floor_s``, for the checkpoint phase at least ``checkpoint.min_timeout_s`` (what its own
  collectives wait).

A main thread that waits inside ``torch.distributed`` (a collective, a store call) is waiting for a peer, not
wedged itself: it is never declared, the peer that does not arrive is. When every rank waits in a collective (one
that some rank never enters), the process group's timeout ends the wait, and that follows the same observations:
``parallel.train_timeout_s`` from step 1 (as before), and once ``wedge_warmup`` steps have been seen
``min(parallel.train_timeout_s, 2 x max(wedge_floor_s, wedge_multiple x the slowest step))``, twice the slowest
phase's bound at least, so a wedged rank is found by its verdict before a peer's collective gives up.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Callable

STARTUP, DATA, FORWARD_BACKWARD, OPTIMIZER, SNAPSHOT, CHECKPOINT, FINAL_CHECKPOINT, CLOSING = (
    "startup",
    "data",
    "forward_backward",
    "optimizer",
    "snapshot",
    "checkpoint",
    "final_checkpoint",
    "closing",
)
#: Phases that happen once per attempt: bounded by the start-up timeout, never by observations. The synchronous
#: save of a stop or of the last step writes everything itself (many times an asynchronous save's blocking part).
_ONCE = (STARTUP, FINAL_CHECKPOINT, CLOSING)
_TORCH_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"


@dataclass
class Heartbeat:
    """What one beat publishes (``hb/<rank>`` in the job's store, as JSON): the beat counter (it moves while the
    heartbeat thread lives) and the main thread's progress (it moves while the main loop does)."""

    beat: int
    step: int
    phase: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Heartbeat | None":
        """The beat in `text`, or None for anything else (``done``, a value of another version)."""
        try:
            d = json.loads(text)
            return cls(int(d["beat"]), int(d["step"]), str(d["phase"]))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Stall:
    """A main thread that has been in one phase longer than its bound (the wedge verdict's evidence)."""

    step: int
    phase: str
    stuck_s: float
    bound_s: float
    rule: str  # how the bound was found, e.g. "max(floor 10 s, 4 x slowest 0.82 s)"


class ProgressTracker:
    """Phase boundaries from the trainer, bounds from their observed durations (see the module docstring).

    tracker = ProgressTracker.from_config(cfg, say=print)
    tracker.enter(DATA, step)     # at each phase boundary, from the main thread
    tracker.step_done(step)       # after each step: the process group's timeout follows the observations
    tracker.stall()               # from the heartbeat thread: a Stall, or None
    """

    def __init__(
        self,
        *,
        floor_s: float,
        multiple: float,
        warmup: int,
        startup_s: float,
        train_timeout_s: float,
        checkpoint_floor_s: float = 0.0,
        set_pg_timeout: Callable[[float], None] | None = None,
        say: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.enabled = floor_s > 0
        self.floor_s, self.multiple, self.warmup, self.startup_s = floor_s, multiple, warmup, startup_s
        self.train_timeout_s, self.checkpoint_floor_s = train_timeout_s, max(floor_s, checkpoint_floor_s)
        self.set_pg_timeout, self.say, self.clock = set_pg_timeout or (lambda s: None), say, clock
        self.main_thread = threading.get_ident()
        self.at: tuple[int, str, float] = (0, STARTUP, clock())  # (step, phase, since): one write, read whole
        self.slowest: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self._iteration_start: float | None = None
        self.slowest_step_s = 0.0
        self.steps_seen = 0
        self.pg_timeout_s: float | None = None

    @classmethod
    def from_config(cls, cfg, *, say: Callable[[str], None] = lambda line: None) -> "ProgressTracker":
        """From the whole Config (parallel.wedge_*, the process-group timeouts, checkpoint.min_timeout_s)."""
        import torch.distributed as dist

        p = cfg.parallel
        return cls(
            floor_s=p.wedge_floor_s,
            multiple=p.wedge_multiple,
            warmup=p.wedge_warmup,
            startup_s=p.init_timeout_s,
            train_timeout_s=p.train_timeout_s,
            checkpoint_floor_s=cfg.checkpoint.min_timeout_s,
            set_pg_timeout=lambda s: dist.group.WORLD.set_timeout(timedelta(seconds=s)),  # a live group, in place
            say=say,
        )

    # ---- the main thread
    def enter(self, phase: str, step: int | None = None) -> None:
        """The main thread starts `phase` (of `step`; None: the same step). Records how long the previous took."""
        now = self.clock()
        current, done, since = self.at
        if done not in _ONCE:
            if self.seen.get(done):  # an attempt's first pass pays one-time costs: counted, not a measure
                self.slowest[done] = max(self.slowest.get(done, 0.0), now - since)
            self.seen[done] = self.seen.get(done, 0) + 1
        if phase == DATA:  # a step is one pass from DATA to the next DATA (saves and waits included)
            if self._iteration_start is not None and self.seen.get(OPTIMIZER, 0) > 1:  # not the first, as above
                self.slowest_step_s = max(self.slowest_step_s, now - self._iteration_start)
            self._iteration_start = now
        self.at = (current if step is None else step, phase, now)  # one assignment: the heartbeat thread reads it

    def step_done(self, step: int) -> None:
        """After `step`: the process group's timeout becomes train_timeout_s after step 1, then follows the
        slowest step once wedge_warmup steps have been seen (rule in the module docstring)."""
        self.steps_seen += 1
        want = self.train_timeout_s
        if self.enabled and self.steps_seen > self.warmup and self.slowest_step_s > 0:
            want = min(self.train_timeout_s, 2 * max(self.floor_s, self.multiple * self.slowest_step_s))
        if self.pg_timeout_s is None or abs(want - self.pg_timeout_s) >= 0.5:  # a change worth the call
            first_observed = self.pg_timeout_s == self.train_timeout_s and want != self.train_timeout_s
            self.pg_timeout_s = want
            self.set_pg_timeout(want)
            if first_observed:
                self.say(
                    f"process-group timeout {want:.1f} s from step {step} on (the observed rule: "
                    f"min(train_timeout_s {self.train_timeout_s:g}, 2 x max(wedge_floor_s {self.floor_s:g}, "
                    f"{self.multiple:g} x slowest step {self.slowest_step_s:.2f} s)))"
                )

    # ---- the heartbeat thread
    def beat(self, beat: int) -> Heartbeat:
        step, phase, _ = self.at
        return Heartbeat(beat, step, phase)

    def bound(self, phase: str) -> tuple[float, str]:
        """(seconds the main thread may stay in `phase`, how that was found)."""
        if phase in _ONCE or self.seen.get(phase, 0) < self.warmup:
            return self.startup_s, f"start-up bound parallel.init_timeout_s {self.startup_s:g} s"
        floor = self.checkpoint_floor_s if phase == CHECKPOINT else self.floor_s
        slowest = self.slowest.get(phase, 0.0)
        rule = f"max(floor {floor:g} s, {self.multiple:g} x slowest {slowest:.2f} s)"
        return max(floor, self.multiple * slowest), rule

    def stall(self, now: float | None = None) -> Stall | None:
        """A Stall when the main thread has been in its phase past the bound and is not waiting for a peer."""
        if not self.enabled:
            return None
        step, phase, since = self.at
        stuck = (self.clock() if now is None else now) - since
        limit, rule = self.bound(phase)
        if stuck <= limit or self.waiting_for_peers():
            return None
        return Stall(step, phase, stuck, limit, rule)

    def waiting_for_peers(self) -> bool:
        """Whether the main thread is inside torch.distributed now (a collective or a store call): its innermost
        Python frame is there. (A C call such as a gloo collective leaves the caller's frame innermost.)"""
        frame = sys._current_frames().get(self.main_thread)
        return frame is not None and _TORCH_DISTRIBUTED in frame.f_code.co_filename

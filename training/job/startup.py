"""Where a worker's start-up seconds go, for the restart breakdown of ``make chaos-test``.

A restart costs: the agent noticing, stopping the old workers, the rendezvous, then each new worker's start-up
(interpreter, imports, process group, model build, state restore) and its first step. The first parts are the
launcher's; this module times the worker's own, from the moment the kernel started the process:

    clock = StartupClock()          # first thing in main()
    clock.mark("imports")           # after the heavy imports
    ...
    clock.summary()                 # {"exec_time": epoch, "preloaded": bool, "interpreter_s": .., ...}

``preloaded`` says whether torch was already imported when ``main()`` began: true for a warm worker, forked
from its agent's forkserver (:mod:`training.launch.warm_workers`), false for a fresh interpreter.

The ``start`` event of ``metrics.jsonl`` carries the summary as ``startup``.
"""

from __future__ import annotations

import os
import sys
import time


def process_age_s() -> float | None:
    """Seconds since this process was started (Linux ``/proc``, 10 ms resolution), else None."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Named marks since the process started; each phase is the time since the previous mark."""

    def __init__(self) -> None:
        now = time.time()
        age = process_age_s()
        self.exec_time = None if age is None else now - age
        self.preloaded = "torch" in sys.modules  # nothing the worker imports before main() imports torch
        self.marks: list[tuple[str, float]] = [("interpreter", now)]

    def mark(self, phase: str) -> None:
        """End `phase` now (it began at the previous mark)."""
        self.marks.append((phase, time.time()))

    def summary(self) -> dict[str, float | None]:
        """``exec_time`` (epoch, None off Linux), ``preloaded`` and ``<phase>_s`` for every phase, in order."""
        out: dict[str, float | bool | None] = {"exec_time": self.exec_time, "preloaded": self.preloaded}
        prev = self.exec_time
        for phase, t in self.marks:
            out[f"{phase}_s"] = None if prev is None else round(t - prev, 3)
            prev = t
        return out

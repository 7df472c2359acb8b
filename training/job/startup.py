"""Where a worker's start-up seconds go, for the restart breakdown (``make chaos-test``, the goodput ledger).

A restart costs: the agent noticing, stopping the old workers, the rendezvous, then each new worker's start-up
and its first step. The first parts are the launcher's; this module times the worker's own, from the moment its
agent asked for the process (``T5_SPAWN_TIME``, stamped by :mod:`training.launch.spawn_time`; else the kernel's
start time of the process):

    clock = StartupClock()          # first thing in main()
    clock.mark("imports")           # after the heavy imports
    ...
    clock.summary()                 # {"spawn_time": epoch, "exec_time": epoch, "preloaded": bool,
                                    #  "process_start_s": .., "imports_s": .., ...}

The phases, in order (:data:`PHASES`; the trainer marks them):

* ``process_start``: the agent's spawn to ``main()`` running (fork/exec and the interpreter; a warm worker is a
  fork of a process that already imported torch, so this is nearly all of its start);
* ``imports``: the training modules and torch (nothing for a warm worker);
* ``device_init``: threads, deterministic kernels, CUDA's initialisation on GPUs (``torch.cuda.set_device``);
* ``process_group``: ``init_process_group``, which waits for every rank of the new group;
* ``model_build``: the model on the meta device, activation checkpointing, compile wrappers, FSDP2, allocating
  this rank's shards, the optimizer, and (a fresh start only, timed after the restore found nothing) drawing the
  seed's initial weights;
* ``job_setup``: metrics, the watchdog, the data set, the run lock and the checkpoint tiers;
* ``restore``: loading the newest state (memory, a peer or storage).

What comes after the ``start`` event, the first step and, when compiled, its compile time, is read from the step
records (:func:`training.goodput.analysis.startup_phases`).

``preloaded`` says whether torch was already imported when ``main()`` began: true for a warm worker, forked
from its agent's forkserver (:mod:`training.launch.warm_workers`), false for a fresh interpreter.

The ``start`` event of ``metrics.jsonl`` carries the summary as ``startup``.
"""

from __future__ import annotations

import math
import os
import sys
import time

from training.job.lifecycle import proc_stat

#: Set by the agent in each worker's environment: the epoch time it started the worker (training.launch.spawn_time).
SPAWN_TIME_ENV = "T5_SPAWN_TIME"
#: The phases the start event's ``startup`` holds, in order (``<phase>_s``).
PHASES = ("process_start", "imports", "device_init", "process_group", "model_build", "job_setup", "restore")


def process_age_s() -> float | None:
    """Seconds since this process was started (Linux ``/proc``, 10 ms resolution), else None."""
    fields = proc_stat("self")
    try:
        start_ticks = int(fields[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, TypeError):  # TypeError: no /proc/self/stat (fields None)
        return None


def spawn_time(env=None) -> float | None:
    """The agent's spawn time of this worker from ``T5_SPAWN_TIME`` (None when unset or not a finite epoch time:
    a worker started by something else than this project's agent)."""
    raw = (os.environ if env is None else env).get(SPAWN_TIME_ENV, "")
    try:
        t = float(raw)
    except ValueError:
        return None
    return t if math.isfinite(t) and t > 0 else None


class StartupClock:
    """Named marks since the process was spawned; each phase is the time since the previous mark."""

    def __init__(self, env=None) -> None:
        now = time.time()
        age = process_age_s()
        self.exec_time = None if age is None else now - age
        self.spawn_time = spawn_time(env)
        self.preloaded = "torch" in sys.modules  # nothing the worker imports before main() imports torch
        self.compiled = False
        self.marks: list[tuple[str, float]] = [("process_start", now)]

    def mark(self, phase: str) -> None:
        """End `phase` now (it began at the previous mark); marking a phase again adds the new interval to it."""
        self.marks.append((phase, time.time()))

    @property
    def began(self) -> float | None:
        """When the first phase began: the agent's spawn, else the kernel's start of the process (None off Linux
        without a spawn time). A spawn time after the exec (clocks of two hosts never meet here: the agent runs on
        this node) would be no spawn time of this process: the exec time is used then."""
        if self.spawn_time is not None and (self.exec_time is None or self.spawn_time <= self.exec_time + 0.05):
            return self.spawn_time
        return self.exec_time

    def summary(self) -> dict[str, float | bool | None]:
        """``began`` (when the first phase began), ``spawn_time`` and ``exec_time`` (epoch seconds or None),
        ``preloaded``, ``compiled`` and ``<phase>_s`` for every phase marked, in order."""
        out: dict[str, float | bool | None] = {
            "began": self.began,
            "spawn_time": self.spawn_time,
            "exec_time": self.exec_time,
            "preloaded": self.preloaded,
            "compiled": self.compiled,
        }
        prev = self.began
        for phase, t in self.marks:  # a phase marked twice (job_setup: before and after the model) adds up
            key = f"{phase}_s"
            seconds = None if prev is None else t - prev + (out.get(key) or 0.0)
            out[key] = None if seconds is None else round(seconds, 3)
            prev = t
        return out

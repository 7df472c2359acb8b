"""Imported last in a node's forkserver (:mod:`training.launch.warm_workers`), never elsewhere: its import *is*
the set-up of that process.

* The forkserver must not hold a CUDA context (a forked worker could not use CUDA): checked, with the fix.
* What every worker's start would pay the same way is paid here once
  (:func:`~training.launch.warm_workers.warm_caches`).
* It must survive the signals that ask the *job* to stop. Slurm (preemption, ``scancel --signal``) signals
  every process of a step, and a forkserver killed by SIGTERM or SIGUSR1 would take its workers with it (they
  die with their parent) before they write the checkpoint the signal asked for. It ignores those; it still
  ends with its agent (EOF on multiprocessing's "alive" pipe) and with SIGKILL. Workers restore the default
  dispositions first thing (:func:`training.launch.warm_workers.run_worker`).
* It ends without interpreter finalization: once its agent is gone, multiprocessing ends it with ``SystemExit``,
  and tearing down the torch and transformers it imported took 1-2 s on a loaded machine, during which it still
  held the agent's stdout and stderr (a caller reading them to the end, as every test does, waited too). Its
  workers never run this: they leave through multiprocessing's ``os._exit``.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

from training.launch.warm_workers import IGNORED_IN_FORKSERVER, WARM_ENV, warm_caches

if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
    raise RuntimeError(
        f"an import preloaded in the forkserver initialized CUDA: set {WARM_ENV}=0 (workers then "
        f"start cold) and report which import did it"
    )
warm_caches()  # each worker's first argument parse, paid here once
for _sig in IGNORED_IN_FORKSERVER:
    signal.signal(_sig, signal.SIG_IGN)


def _exit_now() -> None:
    """The forkserver's last exit handler to be registered, so the first to run: flush and leave at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


atexit.register(_exit_now)

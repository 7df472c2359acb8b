"""Warm workers: each (re)start forks its workers from a process that has already imported torch and the model.

A restart used to start every worker as a fresh ``python -u -m training``: ~0.1 s of interpreter, ~2 s of
``import torch`` and friends, ~1.8 s importing transformers' T5 when the model is built. None of that depends
on the rank or the attempt, yet it was paid on every restart, on every node, while the whole job waited.

Here the agent starts Python's ``multiprocessing`` *forkserver* as soon as it starts (in parallel with the
rendezvous), with :data:`PRELOAD` imported once; torchrun then starts each worker through it (its
``start_method="forkserver"`` for a function entrypoint) and the worker runs :func:`run_worker` with the
training arguments. The forkserver is a fresh interpreter (not a fork of the agent, whose threads could hold
locks), it runs no torch operation and initializes no CUDA (checked after the preload: a CUDA context cannot
cross a fork), it ignores the job-stop signals that Slurm sends to every process (the workers handle them),
and it lives as long as its agent, leaving without interpreter finalization
(:mod:`training.launch.forkserver_init`). Turn it off with
``T5_WARM_WORKERS=0`` in the agents' environment: each worker is then a fresh interpreter again.

What changes for the worker, and is handled:

* ``/proc/PID/environ`` of a forked worker shows the forkserver's environment, not RANK etc. (those are set
  with ``os.environ`` after the fork): tools find workers by their process name, ``t5f-rank-N``
  (:func:`training.job.lifecycle.name_worker`, set in both modes);
* its parent is the forkserver, not the agent: the parent-death signal still chains (the forkserver exits
  when its agent dies, and the worker with it), and the agent's watchdog accepts grandchildren;
* it starts its own session (torchrun's ``start_new_session`` for a cold worker), so a Ctrl-C to the terminal
  reaches it once, through its agent;
* it must *return* on success: torch collects a function's return value, and a worker that exited 0 without
  one would leave its agent waiting. Failures exit with the training module's exit code, as before. The
  process ends with ``os._exit`` either way (multiprocessing's), so interpreter finalization never runs.
"""

from __future__ import annotations

import os
import signal
import sys

#: Agent environment switch: 0/false/no/off starts every worker as a fresh interpreter (the cold path).
WARM_ENV = "T5_WARM_WORKERS"
#: Imported once in the forkserver; a worker's start-up then skips them. The T5 module is what
#: ``training.model`` imports when it builds the model (the largest single import).
PRELOAD = (
    "training.__main__",
    "training.job.trainer",
    "transformers.models.t5.modeling_t5",
    # the etcd client's HTTP library, which the client imports when it first connects: 0.03-0.05 s of an in-place
    # replacement's start (profiled), on the survivors' critical path
    "urllib3",
    "encodings.idna",
    "training.launch.forkserver_init",
)
#: Signals the forkserver ignores so that a signal to every process of the job reaches the workers, which
#: checkpoint and exit, rather than ending the forkserver and, with it, them (:mod:`.forkserver_init`).
#: SIGINT too: a Ctrl-C to the terminal's process group while the forkserver imports the preload would print a
#: KeyboardInterrupt traceback from the middle of ``import torch`` (multiprocessing ignores it only afterwards).
#: The forkserver is born with them ignored (:func:`start_forkserver`), so there is no window.
IGNORED_IN_FORKSERVER = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGINT)
#: torchrun's command for ``--module training``: ``python -u -m training ARGS`` -> our ARGS.
_MODULE_PREFIX = ("-u", "-m", "training")


def enabled(env=None) -> bool:
    """Whether this agent starts warm workers: ``T5_WARM_WORKERS`` unset, empty or 1/true/yes/on; 0/false/no/off
    turns them off (the same spellings as the project's other switches). Anything else raises ValueError
    naming the value."""
    raw = (os.environ if env is None else env).get(WARM_ENV)
    text = (raw or "").strip().lower()
    if text in ("", "1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"{WARM_ENV}={raw!r} is neither true nor false: use 1/true/yes/on (warm workers, the default) "
        f"or 0/false/no/off (each worker a fresh interpreter)"
    )


def start_forkserver() -> None:
    """Start this process's forkserver now, importing :data:`PRELOAD` in it, so that the first workers do not
    wait for the imports (they run while the rendezvous does)."""
    import multiprocessing
    from multiprocessing import forkserver

    # torch's CUDA availability checks by NVML, not by initializing the CUDA driver: a driver initialized in the
    # forkserver would be unusable in every forked worker (the preload makes no such call today: tested)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    # An ignored disposition survives fork and exec: the forkserver ignores the job's stop signals from its
    # first instruction, not only once the preload reaches forkserver_init (seconds later).
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in IGNORED_IN_FORKSERVER}
    try:
        forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def warm_caches() -> None:
    """Pay in the forkserver, once, what every worker's first parse of its arguments would pay: the training
    config's help text, each field's docstring read from its class's source (0.13-0.16 s on a quiet 2-core host,
    0.3-0.7 s loaded, measured in an in-place replacement's start). Every warm worker, an in-place replacement
    among them, is forked with it cached. Pure Python: no torch operation, no CUDA."""
    from training.config import build_arg_parser

    build_arg_parser()


def drop_exit_tracebacks() -> None:
    """Log a warm worker's exit (``failed (exitcode: -9) local_rank: 0 ...``) without the traceback of torch's
    ``ProcessExitedException``.

    That traceback only shows torch's own ``join()``, and formatting it costs the agent ~1.1 s on the restart's
    critical path: torch's log formatter imports ``torch._dynamo`` to format any exception (measured with
    py-spy: the "failed" line was stamped 0.1 s after the SIGKILL, "Stopping worker group" 1.2 s after). A cold
    worker's exit is logged without a traceback, so this makes both the same. A worker that *raised* keeps its
    traceback (``ProcessRaisedException``, from its error file)."""
    import logging

    from torch.multiprocessing import ProcessExitedException

    class _NoExitTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], ProcessExitedException):
                record.exc_info, record.exc_text = None, None
            return True

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NoExitTraceback())


def apply_warm_start(config, cmd, cmd_args: list[str]):
    """torchrun's ``(LaunchConfig, command, args)`` for ``-m training`` turned into a function entrypoint
    started by the forkserver: returns ``(config, run_worker, training_args)``. Anything else (another module,
    a script) is returned unchanged."""
    n = len(_MODULE_PREFIX)
    if not (isinstance(cmd, str) and tuple(cmd_args[:n]) == _MODULE_PREFIX):
        return config, cmd, cmd_args
    config.start_method = "forkserver"
    return config, run_worker, list(cmd_args[n:])


def cold_entry(cmd_args: list[str]) -> list[str]:
    """torchrun's arguments for a cold worker of ``-m training``: ``-m training.launch.worker`` instead, the same
    training module with the commit fence's etcd side installed (:mod:`training.launch.worker`); anything else
    unchanged."""
    n = len(_MODULE_PREFIX)
    if tuple(cmd_args[:n]) != _MODULE_PREFIX:
        return cmd_args
    return [*_MODULE_PREFIX[:-1], "training.launch.worker", *cmd_args[n:]]


def run_worker(*argv: str) -> None:
    """One worker: ``python -m training ARGV`` in this forked process. Returns on success (exit 0); otherwise
    exits with the training module's code."""
    # Its own session, as torchrun gives a cold worker (start_new_session): a Ctrl-C to the terminal's process
    # group reaches the agent, which passes it on once; a worker that got it twice would stop at once.
    os.setsid()
    for sig in IGNORED_IN_FORKSERVER:  # inherited from the forkserver; a worker has the usual dispositions
        signal.signal(sig, signal.SIG_DFL)
    from training.__main__ import main
    from training.launch import inplace_board
    from training.launch.rendezvous.fence import install

    install()  # the commit fence's etcd side (training.checkpoint.fence)
    inplace_board.install()  # failover.in_place's membership board (training.job.failover)
    code = main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)

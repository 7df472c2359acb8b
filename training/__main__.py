"""Entry point: ``torchrun ... -m training [options]`` (see ``python -m training --help``).

Exit codes: 0 finished (or already finished), 2 invalid configuration, 3 checkpoint of another model,
4 checkpoint of a run with other settings (see checkpoint.accept_changes), 5 diverged (non-finite loss or
weights; nothing non-finite was saved), 6 checkpoint storage failed (no space, read-only, permissions),
7 checkpoint.dir in use by another run, 128+signum after checkpointing on SIGTERM/SIGINT/SIGUSR1 (relaunch to
resume; a second SIGINT exits 130 at once, without a checkpoint).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
import warnings

from training.config import ConfigError, parse_args, to_toml
from training.errors import EXIT_CODES, Diverged, Regroup, exit_code, print_error
from training.job.inplace.agreement import InPlaceFailed
from training.job.check import CHECK_ERRORS, already_checked, check_job
from training.job.lifecycle import die_with_agent, exit_without_finalization, name_worker
from training.checkpoint.run_lock import EXIT_BUSY, CheckpointDirBusy
from training.job.startup import StartupClock
from training.job.watchdog import tell_agent_final_exit

KNOWN_ERRORS = {**EXIT_CODES, CheckpointDirBusy: EXIT_BUSY}


def _report(e: BaseException) -> int:
    """Print a known error once per job (rank 0), tell the agent (a restart would stop the same way) and return its
    exit code."""
    if os.environ.get("RANK", "0") == "0":
        print_error(e)
    code = exit_code(e, KNOWN_ERRORS)
    tell_agent_final_exit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    clock = StartupClock()  # the restart breakdown times this worker's start-up from here (training.job.startup)
    name_worker(os.environ.get("RANK"))  # how tools find workers (training.job.lifecycle.WORKER_NAME_PREFIX)
    die_with_agent()  # a worker left behind by a vanished torchrun agent would train on unsupervised
    # Until the trainer handles it (end of start-up), Ctrl-C ends the worker like SIGTERM does: at once and
    # quietly; no step has run, so nothing is lost. (Python's default would print a KeyboardInterrupt traceback.)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # FSDP2 + T5 emit this per step; harmless (gradients match an unsharded model).
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    try:
        cfg, args = parse_args(argv)
    except ConfigError as e:
        if os.environ.get("RANK", "0") == "0":
            print_error(e)
        return 2
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    if not already_checked():  # run directly (python -m training, plain torchrun): nothing checked the job yet
        try:
            check_job(cfg, nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except CHECK_ERRORS as e:
            return _report(e)
    from training.job.trainer import Trainer  # torch import after argument errors are reported

    clock.mark("imports")
    trainer = None
    try:
        trainer = Trainer(cfg, clock)
        code = trainer.train()
    except Regroup as e:  # the ranks agreed to stop here (training.job.stragglers); their writes are settled
        code = e.exit_code
        if trainer is not None:
            trainer.metrics.end("regroup", trainer.progress.step, detail=str(e))
    except InPlaceFailed as e:  # failover.in_place could not recover: it said why in one line; a full restart
        _crash(trainer, said=str(e))
    except Exception as e:  # noqa: BLE001 - the job's one reporter: a known error's line and code, else a crash
        if exit_code(e, KNOWN_ERRORS) is None:
            _crash(trainer)
        code = _report(e)
        if trainer is not None:
            # a diverged run ends at its last good step, which the guard may judge a few steps later
            # (training.job.step_figures): the steps after it ran but are neither recorded nor saved
            step = trainer.recorded_step if isinstance(e, Diverged) else trainer.progress.step
            trainer.metrics.end("error", step, detail=str(e).splitlines()[0][:300])
            # in-memory snapshots since the first bad step must not be what a rerun restores: storage holds
            # the last good state (nothing non-finite is ever saved there)
            trainer.keep_memory = not isinstance(e, Diverged)
    except BaseException:  # noqa: BLE001 - anything else (a signal's exception mid-collective): exit for a restart
        _crash(trainer)
    if trainer is not None:
        trainer.close()
    return code


def _crash(trainer=None, said: str = "") -> None:
    """A peer died or hung (collective timeout) or a step failed. Do not wait for an in-flight async save:
    its collectives wait on the same dead peer, and an uncommitted checkpoint is ignored on resume anyway.
    Exit now so the launcher restarts the group (after the attempt's `end` event, best effort). ``said``: the
    line that was printed already instead of a traceback (an in-place recovery that falls back)."""
    if not said:
        traceback.print_exc()
    try:
        if trainer is not None:
            detail = said or traceback.format_exc().splitlines()[-1]
            trainer.metrics.end("crashed", trainer.progress.step, detail=detail)
    except Exception:  # noqa: BLE001 - the exit matters more than the record
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    exit_without_finalization(main())

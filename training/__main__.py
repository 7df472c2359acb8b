"""Entry point: ``torchrun ... -m training [options]`` (see ``python -m training --help``).

Exit codes: 0 finished (or already finished), 2 invalid configuration, 3 incompatible checkpoint,
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

from training.checkpoint import CheckpointIncompatible
from training.config import ConfigError, load_config
from training.lifecycle import die_with_agent
from training.run_lock import EXIT_BUSY, CheckpointDirBusy


def main(argv: list[str] | None = None) -> int:
    die_with_agent()  # a worker left behind by a vanished torchrun agent would train on unsupervised
    # Until the trainer handles it (end of start-up), Ctrl-C ends the worker like SIGTERM does: at once and
    # quietly; no step has run, so nothing is lost. (Python's default would print a KeyboardInterrupt traceback.)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # FSDP2 + T5 emit this per step; harmless (gradients match an unsharded model).
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    try:
        cfg = load_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from training.trainer import Trainer  # torch import after argument errors are reported
    trainer = None
    try:
        trainer = Trainer(cfg)
        code = trainer.train()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except CheckpointIncompatible as e:
        print(f"error: {e}", file=sys.stderr)
        code = 3
    except CheckpointDirBusy as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_BUSY
    except BaseException:
        # A peer died or hung (collective timeout) or a step failed. Do not wait for an in-flight async
        # save: its collectives wait on the same dead peer, and an uncommitted checkpoint is ignored on
        # resume anyway. Exit now so the launcher restarts the group.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if trainer is not None:
        trainer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())

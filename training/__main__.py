"""Entry point: ``torchrun ... -m training [options]`` (see ``python -m training --help``).

Exit codes: 0 finished (or already finished), 2 invalid configuration, 3 checkpoint of another model,
4 checkpoint of a run with other settings (see checkpoint.accept_changes), 5 diverged (non-finite loss or
weights; nothing non-finite was saved), 6 checkpoint storage failed (no space, read-only, permissions),
128+signum after checkpointing on SIGTERM/SIGUSR1 (relaunch to resume).
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings

from training.config import ConfigError, load_config
from training.errors import EXIT_CODES


def _report(e: BaseException) -> int:
    """Print a known error once per job (rank 0) and return its exit code."""
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {e}", file=sys.stderr, flush=True)
    return EXIT_CODES[type(e)]


def main(argv: list[str] | None = None) -> int:
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
    except Exception as e:
        if type(e) not in EXIT_CODES:
            _crash()
        code = _report(e)
    except BaseException:
        _crash()
    if trainer is not None:
        trainer.close()
    return code


def _crash() -> None:
    """A peer died or hung (collective timeout) or a step failed. Do not wait for an in-flight async save:
    its collectives wait on the same dead peer, and an uncommitted checkpoint is ignored on resume anyway.
    Exit now so the launcher restarts the group."""
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())

"""Checks of the training arguments before any agent starts, so a typo fails in seconds, not minutes."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from typing import Sequence

from training.job.micro_batch_fit import micro_batch_warnings
from training.launch.commands import training_argv
from training.launch.config import LaunchConfig, LaunchError
from training.checkpoint.run_lock import RunLock


def preflight(cfg: LaunchConfig) -> list[str]:
    """Validate the training arguments before any agent starts; returns warnings, raises LaunchError.

    torchrun retries a worker that exits 2 (bad config) ``--max-restarts`` times, start-up included, so a
    typo would cost minutes before failing. Only for the project's own training module.
    """
    if cfg.module != "training":
        return []
    from training.config import ConfigError, load_config  # no torch import: cheap

    try:
        tcfg = load_config(training_argv(cfg))
    except ConfigError as e:
        raise LaunchError(f"training arguments: {e}") from None
    except SystemExit:  # argparse already printed what is wrong
        raise LaunchError("training arguments rejected (see above); python -m training --help lists them") from None
    if not isinstance(cfg.nproc_per_node, int):
        return []
    gb = tcfg.train.global_batch
    worlds = [n * cfg.nproc_per_node for n in range(cfg.min_nodes, cfg.max_nodes + 1)]
    bad = [w for w in worlds if gb % w]
    if len(bad) == len(worlds):
        raise LaunchError(
            f"train.global_batch={gb} divides by none of the world sizes {worlds} this launch "
            f"allows ({cfg.min_nodes}..{cfg.max_nodes} nodes x {cfg.nproc_per_node}); pick a multiple "
            f"of {cfg.max_nodes * cfg.nproc_per_node}"
        )
    warnings = micro_batch_warnings(tcfg.train.micro_batch, {w: gb // w for w in worlds if w not in bad})
    if bad:
        warnings.insert(
            0,
            f"train.global_batch={gb} does not divide by world sizes {bad}: if the job runs at one of "
            f"them the workers exit with a config error; raise --min-nodes or choose another global batch",
        )
    return warnings


def check_module(module: str) -> None:
    """Raise LaunchError unless the module the workers run (``torchrun --module``) is found here. Looked up, not
    imported (its import may be heavy, or start things): a missing one made every worker exit 'No module named',
    which torchrun restarted ``--max-restarts`` times, each a full round (31 lines) before the launcher failed."""
    why = ""
    try:
        found = importlib.util.find_spec(module) is not None
    except Exception as e:  # noqa: BLE001 - a missing parent package, an empty or relative name, a broken parent
        found, why = False, f" ({e})"
    if not found:
        raise LaunchError(
            f"--module {module!r} is not importable here{why}, and the workers run python -m "
            f"{module}; pass an installed module (default training) or set PYTHONPATH so it is found"
        )


def checkpoint_dir(train_args: Sequence[str]) -> str | None:
    """The checkpoint.dir that ``python -m training`` resolves from ``train_args``; None if they are invalid
    (quietly: the caller reports those through :func:`preflight` or the workers)."""
    from training.config import ConfigError, load_config

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return load_config(list(train_args)).checkpoint.dir
    except (ConfigError, SystemExit):
        return None


def job_out_dir(train_args: Sequence[str]) -> str | None:
    """The job.out_dir that ``python -m training`` resolves from ``train_args``; None if they are invalid."""
    from training.config import ConfigError, load_config

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return load_config(list(train_args)).job.out_dir
    except (ConfigError, SystemExit):
        return None


def in_place(train_args: Sequence[str]) -> bool:
    """Whether ``python -m training`` resolves ``failover.in_place`` on from ``train_args`` (False if they are
    invalid: the workers report those)."""
    from training.config import ConfigError, load_config

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return bool(load_config(list(train_args)).failover.in_place)
    except (ConfigError, SystemExit):
        return False


def check_checkpoint_dir(cfg: LaunchConfig) -> None:
    """Raise :class:`training.checkpoint.run_lock.CheckpointDirBusy` if another run holds the training's checkpoint.dir.

    Only for a launch that owns the whole job (local nodes): on a cluster, a replacement node's launcher
    starts while the job, lock held, is running.
    """
    if cfg.module == "training":
        d = checkpoint_dir(training_argv(cfg))
        if d:
            RunLock(d).check()


def check_training_job(train_args: Sequence[str], *, nproc_per_node: int | None, world: int | None = None) -> int:
    """Check the job ``python -m training train_args`` would run, on this host (training.job.check), and
    against ``world`` when the world size is fixed: 0 when fine; else print its one-line error and return the
    job's exit code for it (2 settings/data/world, 6 storage)."""
    import sys

    from training.config import ConfigError, check_world, load_config
    from training.errors import exit_code
    from training.job.check import CHECK_ERRORS, check_job

    try:
        cfg = load_config(list(train_args))
        if world:
            check_world(cfg, world)
        check_job(cfg, nproc_per_node=nproc_per_node, say=lambda m: print(f"[check] {m}", flush=True))
    except (ConfigError, *CHECK_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return exit_code(e) or 2
    return 0

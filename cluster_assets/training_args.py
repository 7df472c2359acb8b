"""Training arguments checked before a job is queued, the same way for every cluster.

Both submitters (Slurm: ``cluster_assets/slurm/render.py``; EKS: ``tools/k8s/submit.py``) call
:func:`check_training_args`, so what one rejects the other rejects too: unknown flags and bad values (the
training package's own parser and validation) and the checks that need the world size, e.g. a global batch
the world size does not divide, which would otherwise fail on every rank minutes later, after the job was
scheduled and the model built.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from typing import Sequence


def split_training_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(submit options, training arguments) of a submit command line: every ``--section.field VALUE``, ``--config
    FILE`` and everything after a bare ``--`` is the training job's.

    Split before the submit's own parser sees the line: argparse would read a value that starts with '-'
    (``--train.steps -1``) as an option of its own, not as the value of a flag it does not know. Training flags always
    take one value (booleans as true/false), so the value is the next word unless the flag has ``=VALUE``.
    """
    ours: list[str] = []
    train: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            train += argv[i + 1 :]
            break
        name = a.split("=", 1)[0]
        if a.startswith("--") and ("." in name or name == "--config"):
            take = 1 if "=" in a else 2
            train += argv[i : i + take]
            i += take
            continue
        ours.append(a)
        i += 1
    return ours, train


class TrainingArgsError(ValueError):
    """The training arguments cannot run at this size; the message names the value and the fix."""


def check_training_args(
    preset: str,
    args: Sequence[str],
    *,
    nodes: int,
    nproc_per_node: int,
    files_here: bool = False,
    python: str | None = None,
    gpus_per_node: int | None = None,
) -> None:
    """Parse ``--preset preset args`` with ``python -m training``'s parser, validate, and check the world size.

    ``files_here``: this host sees the job's files where the job will (a Slurm head node on the shared file
    system): the data, the weights to start from and the output locations are checked too
    (training.job.check), so an empty corpus or a read-only directory fails before the job is queued.
    Skipped when the training package is not importable here (a host that only has the container image).
    ``python``: the interpreter the job's nodes run (a venv on shared storage, no container): a preset that trains
    on CUDA needs its torch to be a CUDA build (a CPU venv would stop every rank at start, after the queue wait).
    ``gpus_per_node``: the GPUs the job asks the scheduler for on each node (None: not known here); a preset that
    trains on CUDA needs some (without them the scheduler hands out none, and every rank stops at start).
    Raises :class:`TrainingArgsError` with the parser's or validator's message.
    """
    try:
        from training.config import ConfigError, check_world, load_config
        from training.job.check import CHECK_ERRORS, check_job
    except ImportError:  # pragma: no cover - the training package is in this repository
        return
    world = nodes * nproc_per_node
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # argparse prints its usage; keep only the message
            cfg = load_config(["--preset", preset, *args])
        check_world(cfg, world)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        raise TrainingArgsError(f"training arguments rejected: {lines[-1] if lines else ' '.join(args)}") from None
    except ConfigError as e:
        raise TrainingArgsError(
            f"training arguments rejected: {e} (world size {nodes} node(s) x {nproc_per_node} = {world})"
        ) from None
    if files_here:
        try:
            check_job(cfg, files=True, device=False)  # the GPUs are on the compute nodes, not here
        except CHECK_ERRORS as e:
            raise TrainingArgsError(f"training arguments rejected: {e}") from None
    if cfg.parallel.device == "cuda" and gpus_per_node == 0:
        raise TrainingArgsError(
            f"preset {preset!r} trains on CUDA GPUs, but the job asks for no GPUs per node; "
            "pass --instance-type with the GPU nodes' instance type (e.g. p5.48xlarge: one "
            "process per GPU, the EFA settings) or --gpus-per-node N, or choose a CPU preset "
            "(debug)"
        )
    if python and cfg.parallel.device == "cuda":
        _check_cuda_build(python, preset)


def _check_cuda_build(python: str, preset: str) -> None:
    """Refuse a CUDA preset whose interpreter has a CPU-only torch (no GPU needed here: the build says it)."""
    if not os.access(python, os.X_OK):
        raise TrainingArgsError(
            f"{python} is not an interpreter on this host; build the venv on the shared "
            "storage the nodes mount (TORCH_BUILD=cu130 scripts/venv.sh) or pass --python"
        )
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__, torch.version.cuda or '')"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise TrainingArgsError(
            f"{python} cannot import torch ({last}); rebuild its venv: TORCH_BUILD=cu130 scripts/venv.sh"
        )
    version, _, cuda = probe.stdout.strip().partition(" ")
    if not cuda:
        raise TrainingArgsError(
            f"preset {preset!r} trains on CUDA GPUs, but the nodes would run {python} whose torch "
            f"{version} is a CPU-only build; build that venv with the CUDA build "
            "(TORCH_BUILD=cu130 scripts/venv.sh) or run the training image (--container-image)"
        )

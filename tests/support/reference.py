"""A cached uninterrupted run of the training module: the bitwise reference of a chaos run with the same training
arguments and world size, kept under ``.chaos/cache`` by those arguments and the training code (the key the local
chaos harness gives its own references, :func:`chaos.local.config.math_key`), so that only the first run pays."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from chaos.local.config import REPO, math_key
from tests.conftest import torchrun
from training.checkpoint import verify

CACHE = REPO / ".chaos" / "cache"


def cached_reference(args: list[str], nproc: int, steps: int, tmp: Path) -> Path:
    """The final checkpoint (``<dir>/checkpoints/step_<steps>``, its ``metrics.jsonl`` two levels up) of torchrun
    on ``nproc`` processes with the training arguments ``args``, whose ``--job.out_dir`` is replaced; run in
    ``tmp`` and cached the first time."""
    args = list(args)
    out = args.index("--job.out_dir") + 1
    key = math_key({"torchrun_reference": args[:out] + args[out + 1 :], "nproc": nproc})
    cache = CACHE / f"torchrun-{key}"
    final = cache / "checkpoints" / f"step_{steps:08d}"
    if verify(final)[0] and (cache / "metrics.jsonl").is_file():
        return final
    args[out] = str(tmp / "reference")
    r = torchrun(nproc, *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    staged = cache.with_name(f"{cache.name}.{os.getpid()}")  # a half-copied cache never looks complete
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(tmp / "reference" / "checkpoints" / final.name, staged / "checkpoints" / final.name)
    shutil.copy(tmp / "reference" / "metrics.jsonl", staged / "metrics.jsonl")
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(staged, cache)
    return final

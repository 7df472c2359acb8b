"""Compare two checkpoints (model + optimizer), bitwise by default.

    python -m training.compare runs/a/checkpoints/step_00000040 runs/b/checkpoints/step_00000040 [--atol 1e-6]

A or B may also be a whole checkpoint.dir (its newest complete checkpoint is compared). Only verified
checkpoints are compared: every file's size and CRC32C as recorded in COMMITTED.json, the check export makes.
Exit 0 when equal (within --atol if given), 1 when not, 2 for a bad option, a path that is not a checkpoint
or a checkpoint that is incomplete or damaged.
Runs in one process without a process group: DCP reads the shards of every rank.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from training.torch_private import load_dcp_state_dict
from training.checkpoint import MARKER, parse_step, read_marker, scan, verify
from training.checkpoint.integrity import crc32c_file, storage_reason

COMPARED_PREFIXES = ("train.model.", "train.optim.")
#: What `python -m training.export` writes (and `from_pretrained` reads): a model, not a training checkpoint.
HF_CONFIG = "config.json"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
CHECKPOINT_KINDS = "a step_NNNNNNNN directory or a checkpoint.dir"


def checksum_problem(ckpt: Path) -> str | None:
    """The first file of `ckpt` whose CRC32C differs from the one its commit marker recorded, in words, or None.

    One process reads every file (the tools' check; a training job shares this out over its ranks). Markers of
    format 1 recorded sizes only: nothing to check beyond what :func:`training.checkpoint.verify` did."""
    for name, rec in read_marker(ckpt)["files"].items():
        if isinstance(rec, dict) and "crc32c" in rec:
            got = crc32c_file(ckpt / name)
            if got != rec["crc32c"]:
                return f"file {ckpt / name} fails its checksum (crc32c {got}, {rec['crc32c']} was written)"
    return None


def _hf_weights(path: Path) -> str | None:
    """The weights file of a Hugging Face model directory (config.json beside it), else None."""
    if not (path / HF_CONFIG).is_file():
        return None
    return next((w for w in HF_WEIGHTS if (path / w).is_file()), None)


def _looks_like_step_dir(path: Path) -> bool:
    """A checkpoint step directory, committed or not (its name, or DCP's metadata file)."""
    return parse_step(path) is not None or (path / ".metadata").is_file()


def resolve_checkpoint(path: str | Path, use: str) -> Path:
    """`path` as a complete, checksum-verified checkpoint step directory: itself, or for a checkpoint.dir its
    newest complete checkpoint. Raises ValueError saying what `path` is instead; `use` completes the fix
    ("compare checkpoints", "export a checkpoint")."""
    given = Path(path)
    if not given.exists():
        raise ValueError(f"{path} does not exist; {use} ({CHECKPOINT_KINDS})")
    if not given.is_dir():
        raise ValueError(f"{path} is a file, not a training checkpoint; {use} ({CHECKPOINT_KINDS})")
    ckpt = given
    if not (given / MARKER).exists() and not _looks_like_step_dir(given):
        weights = _hf_weights(given)
        if weights:
            raise ValueError(
                f"{path} is a Hugging Face model directory ({HF_CONFIG} + {weights}), not a "
                f"training checkpoint; {use} ({CHECKPOINT_KINDS})"
            )
        good, bad = scan(given)
        if not good:
            found = (
                f"holds no complete checkpoint (newest: {bad[0][0].name}: {bad[0][1]})"
                if bad
                else "holds no training checkpoint (no COMMITTED.json, no step_NNNNNNNN directory)"
            )
            raise ValueError(f"{path} {found}; {use} ({CHECKPOINT_KINDS})")
        ckpt = good[0]  # a checkpoint.dir: its newest complete checkpoint
    ok, why = verify(ckpt)
    if not ok:
        raise ValueError(f"{ckpt} is not a complete checkpoint: {why}")
    damaged = checksum_problem(ckpt)
    if damaged:
        raise ValueError(f"{ckpt} is damaged: {damaged}; pass another checkpoint (e.g. an older step)")
    return ckpt


def load_full(path: str | Path) -> dict[str, object]:
    """Every entry of a DCP checkpoint as a flat {dotted key: value} dict of full (unsharded) tensors."""
    sd: dict[str, object] = {}
    load_dcp_state_dict(sd, str(path))
    flat: dict[str, object] = {}

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict):
            for k, sub in v.items():
                walk(f"{prefix}{k}.", sub)
        else:
            flat[prefix[:-1]] = v

    walk("", sd)
    return flat


def diff(a: dict[str, object], b: dict[str, object], atol: float = 0.0) -> list[str]:
    """Keys (model/optimizer only) that differ: missing on one side, other shape, or unequal values."""
    keys = sorted(k for k in set(a) | set(b) if k.startswith(COMPARED_PREFIXES))
    out = []
    for k in keys:
        if k not in a or k not in b:
            out.append(f"{k}: only in {'first' if k in a else 'second'}")
            continue
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"{k}: {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype}")
            elif atol == 0.0 and not torch.equal(x, y):
                out.append(f"{k}: max |diff| {(x.double() - y.double()).abs().max().item():.3e}")
            elif atol and not torch.allclose(x.double(), y.double(), rtol=0.0, atol=atol):
                out.append(f"{k}: max |diff| {(x.double() - y.double()).abs().max().item():.3e} > {atol}")
        elif x != y:
            out.append(f"{k}: {x!r} vs {y!r}")
    return out


def _load_verified(path: str | Path) -> dict[str, object]:
    ckpt = resolve_checkpoint(path, "compare checkpoints")
    try:
        return load_full(ckpt)
    except (OSError, CheckpointException, RuntimeError) as e:  # verified, yet unreadable (e.g. a format-1 marker)
        raise ValueError(f"{ckpt} cannot be read: {storage_reason(e)}") from None


def _compare(path_a: str | Path, path_b: str | Path, atol: float) -> tuple[list[str], int]:
    """(differences, number of model/optimizer entries in A)."""
    if not (math.isfinite(atol) and atol >= 0):
        raise ValueError(f"atol={atol}: the tolerance must be a finite number >= 0 (0 = bitwise)")
    a, b = _load_verified(path_a), _load_verified(path_b)
    return diff(a, b, atol), sum(k.startswith(COMPARED_PREFIXES) for k in a)


def compare(path_a: str | Path, path_b: str | Path, atol: float = 0.0) -> list[str]:
    """The differences between two verified checkpoints; raises ValueError for a bad path, checkpoint or atol."""
    return _compare(path_a, path_b, atol)[0]


def parse_atol(text: str) -> float:
    """--atol's value: a finite number >= 0; otherwise ValueError naming it and the fix."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"--atol {text}: the tolerance must be a number >= 0 (0 = bitwise equality); use e.g. --atol 1e-6"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", help=f"a checkpoint: {CHECKPOINT_KINDS} (its newest complete one)")
    ap.add_argument("b", help=f"a checkpoint: {CHECKPOINT_KINDS} (its newest complete one)")
    # Read as text and checked below, so a bad value is one line naming it (argparse would add its usage).
    ap.add_argument("--atol", default="0", help="absolute tolerance, >= 0; 0 = bitwise equality")
    args = ap.parse_args(argv)
    try:
        atol = parse_atol(args.atol)
        diffs, n = _compare(args.a, args.b, atol)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if diffs:
        print(f"DIFFERENT: {len(diffs)} of {n} model/optimizer entries differ")
        for d in diffs[:50]:
            print("  " + d)
        return 1
    print(f"EQUAL: {n} model/optimizer entries {'bitwise equal' if not atol else f'within {args.atol}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

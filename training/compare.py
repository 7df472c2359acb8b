"""Compare two checkpoints (model + optimizer), bitwise by default.

    python -m training.compare runs/a/checkpoints/step_00000040 runs/b/checkpoints/step_00000040 [--atol 1e-6]

Exit 0 when equal (within --atol if given), 1 when not, 2 when a path is not a complete checkpoint.
Runs in one process without a process group: DCP reads the shards of every rank.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from training.checkpoint import verify

COMPARED_PREFIXES = ("train.model.", "train.optim.")


def load_full(path: str | Path) -> dict[str, object]:
    """Every entry of a DCP checkpoint as a flat {dotted key: value} dict of full (unsharded) tensors."""
    sd: dict[str, object] = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
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


def compare(path_a: str | Path, path_b: str | Path, atol: float = 0.0) -> list[str]:
    for p in (path_a, path_b):
        ok, why = verify(Path(p))
        if not ok:
            raise ValueError(f"{p} is not a complete checkpoint: {why}")
    return diff(load_full(path_a), load_full(path_b), atol)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="checkpoint step directory")
    ap.add_argument("b", help="checkpoint step directory")
    ap.add_argument("--atol", type=float, default=0.0, help="absolute tolerance; 0 = bitwise equality")
    args = ap.parse_args(argv)
    try:
        diffs = compare(args.a, args.b, args.atol)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = len([k for k in load_full(args.a) if k.startswith(COMPARED_PREFIXES)])
    if diffs:
        print(f"DIFFERENT: {len(diffs)} of {n} model/optimizer entries differ")
        for d in diffs[:50]:
            print("  " + d)
        return 1
    print(f"EQUAL: {n} model/optimizer entries {'bitwise equal' if not args.atol else f'within {args.atol}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

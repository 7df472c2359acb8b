"""Export a checkpoint as a Hugging Face model directory (``config.json`` + ``model.safetensors``).

    python -m training.export runs/debug/checkpoints/step_00000060 exported/
    python -c "from transformers import T5ForConditionalGeneration as T; T.from_pretrained('exported/')"

Runs in one process without a process group (DCP reads every rank's shard) and needs no GPU. The model's
shape comes from the checkpoint's commit marker, so no training flags are needed. Only verified checkpoints
are exported (sizes and checksums as recorded at commit). Exit 0 on success, 2 for a bad path or checkpoint.
The exported directory also works as ``--model.init_from DIR`` for a new run.
"""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
from pathlib import Path

MODEL_PREFIX = "train.model."


def export(ckpt: str | Path, out: str | Path) -> Path:
    """Write the checkpoint's model as a Hugging Face directory; returns it. Raises ValueError on a bad input."""
    from training.checkpoint import read_marker
    from training.compare import load_full, resolve_checkpoint
    from training.config import ModelConfig
    from training.model.t5 import build_model

    out = Path(out)
    # The same check compare makes: what the path is, the commit marker, every file's size and CRC32C.
    ckpt = resolve_checkpoint(ckpt, "export a checkpoint")
    info = read_marker(ckpt)
    made = _new_out_dir(out)
    try:
        model = build_model(ModelConfig(**info["signature"]), seed=0)
        weights = {k[len(MODEL_PREFIX) :]: v for k, v in load_full(ckpt).items() if k.startswith(MODEL_PREFIX)}
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{ckpt} does not hold this model's weights (missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        try:
            model.save_pretrained(out)
        except OSError as e:
            raise ValueError(
                f"cannot write {out}: {e.strerror or e}; choose a writable directory with room (nothing was left there)"
            ) from None
    except BaseException:
        _discard(out, made)
        raise
    return out


def _new_out_dir(out: Path) -> Path | None:
    """Make ``out`` an empty directory to export into; returns the first directory this made (None: ``out``
    was there, empty), so a failed export removes exactly what it made. A path that is a file, lies under a
    file, or cannot be created is one ValueError naming it and the fix (not a bare errno)."""
    if out.is_dir():
        if any(out.iterdir()):
            raise ValueError(f"{out} exists and is not empty; choose a new directory (nothing was overwritten)")
        return None
    if out.exists() or out.is_symlink():
        what = "a file" if out.exists() else "a symbolic link to nothing"
        raise ValueError(
            f"{out} is {what}, not a directory; choose a new directory for the export (nothing was overwritten)"
        )
    first = out
    while not first.parent.exists() and first.parent != first.parent.parent:
        first = first.parent
    if first.parent.exists() and not first.parent.is_dir():
        raise ValueError(
            f"cannot create {out}: {first.parent} is a file, not a directory; choose a new directory elsewhere"
        )
    try:
        out.mkdir(parents=True)
    except OSError as e:
        # mkdir in /proc or /sys says ENOENT though the parent is there: say what that means
        why = (
            f"{first.parent} takes no new directories"
            if e.errno == errno.ENOENT and first.parent.is_dir()
            else e.strerror or str(e)
        )
        raise ValueError(f"cannot create {out}: {why}; choose a new directory on a writable file system") from None
    return first


def _discard(out: Path, made: Path | None) -> None:
    """Undo a failed export: remove the directories it made, or empty the one that was empty before."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.export",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("checkpoint", help="a step_NNNNNNNN directory, or a checkpoint.dir (its newest complete one)")
    p.add_argument(
        "out",
        help="new (or empty) directory for config.json + model.safetensors; made with its parents, "
        "and removed again if the export fails",
    )
    a = p.parse_args(argv)
    try:
        out = export(a.checkpoint, a.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {a.checkpoint} -> {out} (T5ForConditionalGeneration.from_pretrained({str(out)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

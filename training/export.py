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
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; choose a new directory (nothing was overwritten)")
    model = build_model(ModelConfig(**info["signature"]), seed=0)
    weights = {k[len(MODEL_PREFIX):]: v for k, v in load_full(ckpt).items() if k.startswith(MODEL_PREFIX)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{ckpt} does not hold this model's weights (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("checkpoint", help="a step_NNNNNNNN directory, or a checkpoint.dir (its newest complete one)")
    p.add_argument("out", help="new directory for config.json + model.safetensors")
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

"""The baseline every GPU figure is a ratio to: a plain Hugging Face T5 of the preset's shape, trained the way a user
would without this project, in one process: fp32 master weights, bf16 autocast (on a GPU), fused AdamW, no FSDP,
no checkpoints, the same batches (span corruption over the same data) and the same FLOP count for MFU
(:func:`training.bench._flops_per_step`).

    python -m training.bench_hf --preset t5-large --steps 10 --out bench/gpu/hf-baseline.json -- --train.global_batch 32
    python -m training.bench_hf --preset debug --steps 2 --warmup 1 --out /tmp/hf.json     # runs on a CPU too

It writes one row in the format of ``python -m training.bench run --steps-only`` (``variant`` = ``plain HF``), so
``python -m training.bench report`` prints it next to the project's rows and their ratio to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from training.bench import BASELINE_VARIANT as VARIANT  # what ``training.bench report`` compares the rows to


def _autocast(device: torch.device, bf16: bool):
    """bf16 autocast on a GPU (fp32 master weights stay fp32); nothing on a CPU unless asked (bf16 is ~9x slower
    there: measured on this project's 2-core CPU)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m training.bench_hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="debug")
    ap.add_argument("--warmup", type=int, default=2, help="steps before timing")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--out", required=True, help="JSON file for the row")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: by GPU name)")
    ap.add_argument(
        "--autocast", choices=("auto", "bf16", "off"), default="auto", help="auto: bf16 on a GPU, off on a CPU"
    )
    ap.add_argument("extra", nargs="*", help="training overrides after --, e.g. -- --train.global_batch 32")
    a = ap.parse_args(argv)
    from training.bench import PEAK_BF16_TFLOPS, _flops_per_step
    from training.config import load_config
    from training.data.dataset import build_dataloader, build_dataset
    from training.model.t5 import build_model, count_params

    cfg = load_config(["--preset", a.preset, "--job.out_dir", str(Path(a.out).parent), *a.extra])
    if cfg.model.attention in ("sdpa_bias", "flex"):  # this project's kernels (training/model/): not plain HF
        cfg.model.attention = "sdpa"
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.parallel.device != "cpu" else "cpu")
    bf16 = a.autocast == "bf16" or (a.autocast == "auto" and device.type == "cuda")
    torch.set_num_threads(cfg.parallel.threads)
    torch.manual_seed(cfg.job.seed)
    model = build_model(cfg.model, seed=cfg.job.seed).to(device)  # fp32 weights: autocast computes in bf16
    if cfg.parallel.activation_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    t = cfg.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay, fused=True)
    dataset = build_dataset(cfg.data, cfg.job.seed)
    loader = iter(
        build_dataloader(
            dataset, cfg.data, seed=cfg.job.seed, global_batch=t.global_batch, rank=0, world=1, start_offset=0
        )
    )
    micro = t.micro_batch or t.global_batch

    def step() -> tuple[float, int]:
        batch = {k: v.to(device, non_blocking=True) for k, v in next(loader).items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        parts = list(
            zip(batch["input_ids"].split(micro), batch["attention_mask"].split(micro), batch["labels"].split(micro))
        )
        for ids, mask, labels in parts:
            with _autocast(device, bf16):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss  # HF's own mean loss
            (loss / len(parts)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum())

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    warmup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, toks = zip(*(step() for _ in range(a.steps)))
    step_s = statistics.median(times)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else ""
    peak = a.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), 0.0)
    flops = _flops_per_step(model, t.global_batch, cfg.data.seq_len, dataset.target_len)
    row = {
        "preset": a.preset,
        "variant": VARIANT,
        "params": count_params(model),
        "world_size": 1,
        "precision": "fp32 weights, bf16 autocast" if bf16 else "fp32",
        "global_batch": t.global_batch,
        "step_s": step_s,
        "tokens_per_s": statistics.median(toks) / step_s,
        "warmup_s": warmup_s,
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "device": gpu or "cpu",
        "tflops_per_s": flops / step_s / 1e12,
        "mfu": flops / step_s / 1e12 / peak if peak else None,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(row, indent=1))
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    run(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throughput and checkpoint-stall benchmark (figures, not assertions).

Worker (under torchrun): measures steady-state step time and tokens/s, then the time training is
blocked by one checkpoint save in three ways: our async DCP save, our sync DCP save, and the baseline the
published samples use (gather a full state dict, ``torch.save`` on rank 0, synchronously).

    torchrun --standalone --nproc_per_node=2 -m training.bench run --preset t5-60m --out bench/out/t5-60m.json
    python -m training.bench report bench/out/*.json --json bench/out/summary.json

``make bench`` runs both presets and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from training import bench_copy, bench_saves

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "B200": 2250.0}


def _flops_per_step(model, global_batch: int, seq_len: int, target_len: int) -> float:
    """6 x parameters x tokens, with encoder parameters seeing encoder tokens and decoder parameters
    (plus the tied output projection) seeing decoder tokens. Attention score FLOPs are left out."""
    enc = sum(p.numel() for n, p in model.named_parameters() if n.startswith("encoder."))
    dec = sum(p.numel() for n, p in model.named_parameters() if n.startswith("decoder."))
    head = model.config.vocab_size * model.config.d_model
    return 6.0 * global_batch * (enc * seq_len + (dec + head) * target_len)


def _throughput(trainer, cfg, step_s: float, peak_tflops: float) -> dict:
    """Device name, model TFLOP/s and MFU (against `peak_tflops`, else the GPU's bf16 peak by name)."""
    gpu = torch.cuda.get_device_name() if trainer.device.type == "cuda" else ""
    peak = peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), 0.0)
    flops = _flops_per_step(trainer.model, cfg.train.global_batch, cfg.data.seq_len, trainer.dataset.target_len)
    return {
        "device": gpu or "cpu",
        "tflops_per_s": flops / step_s / 1e12,
        "mfu": (flops / step_s / 1e12 / (peak * trainer.world)) if peak else None,
    }


def _write(trainer, out: str, res: dict) -> None:
    """Rank 0 writes the figures to `out` and prints them as one JSON line."""
    if trainer.rank == 0:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=1))
        print(json.dumps({k: v for k, v in res.items() if k != "ckpt_block_all_s"}), flush=True)


def _baseline_save(trainer, path: Path) -> float:
    """What published FSDP samples do: full state dict gathered to rank 0 and torch.save, blocking."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    t0 = time.perf_counter()
    msd, osd = get_state_dict(
        trainer.model, trainer.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if trainer.rank == 0:
        torch.save({"model": msd, "optim": osd}, path)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if trainer.rank == 0:
        path.unlink()  # only the time matters; a t5-large copy is 8.6 GB
    return elapsed


def _memory_figures(trainer, timed_step, step: int, n: int) -> dict[str, float]:
    """In-memory snapshot every step: step time with it (the copy overlaps the next step; the optimizer waits
    for it), the copy alone, and restore time from memory vs from the newest storage checkpoint."""
    mem = trainer.ckpt.memory
    plain = [timed_step()[0] for _ in range(n)]  # the same steps without, just before (this machine is noisy)
    with_snapshot, blocked, copies = [], [], []
    for _ in range(n + 2):
        step += 1
        waited = mem.waited_s
        t0 = time.perf_counter()
        timed_step()  # its optimizer step waits for the previous copy (counted in waited_s)
        captured = mem.snapshot(step, trainer.state)  # includes waiting for a copy still running
        with_snapshot.append(time.perf_counter() - t0)
        blocked.append(captured + mem.waited_s - waited)
    mem.wait()
    plain += [timed_step()[0] for _ in range(n)]  # and just after: a drift of the machine cancels out
    for _ in range(2):
        step += 1
        t0 = time.perf_counter()
        mem.snapshot(step, trainer.state)
        mem.wait()
        copies.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    got = mem.restore(trainer.state, storage_step=0)
    from_memory = time.perf_counter() - t0 if got else float("nan")
    t0 = time.perf_counter()
    trainer.ckpt.storage.load(trainer.state)
    from_storage = time.perf_counter() - t0
    # the first two snapshots fault in the pages of the two generations' buffers (once per run)
    return {
        "snapshot_step_s": statistics.median(with_snapshot[2:]),
        "snapshot_base_step_s": statistics.median(plain),
        "snapshot_block_s": statistics.median(blocked[2:]),
        "snapshot_copy_s": statistics.median(copies),
        "snapshot_bytes_per_rank": sum(b.numel() for b in mem.own.bufs.values()) / max(1, len(mem.own.bufs)),
        "restore_memory_s": from_memory,
        "restore_storage_s": from_storage,
    }


def _auto_interval(memory: dict[str, float], ckpt) -> dict:
    """What checkpoint.memory_interval=auto takes for the measured figures: a snapshot's blocking (capture plus the
    wait for its copy) against the step without snapshots, within checkpoint.memory_budget (the run's setting),
    at most checkpoint.interval; and the share of training time it blocks at that interval."""
    from training.checkpoint.snapshot_budget import Choice, interval_for

    n = interval_for(memory["snapshot_block_s"], memory["snapshot_base_step_s"], ckpt.memory_budget, ckpt.interval)
    chosen = Choice(n, memory["snapshot_block_s"], memory["snapshot_base_step_s"], ckpt.memory_budget, ckpt.interval)
    return {
        "snapshot_auto_interval": n,
        "snapshot_auto_share": chosen.share,
        "snapshot_budget": ckpt.memory_budget,
        "snapshot_max_interval": ckpt.interval,
    }


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.bench run")
    ap.add_argument("--preset", default="debug")
    ap.add_argument("--warmup", type=int, default=2, help="steps before timing")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--saves", type=int, default=2, help="saves of each kind (median reported)")
    ap.add_argument("--out", required=True, help="JSON file for the figures (written by rank 0)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: by GPU name)")
    ap.add_argument(
        "--steps-only",
        action="store_true",
        help="measure steps only (time, tokens/s, MFU, peak GPU memory): no saves, no snapshots",
    )
    ap.add_argument("extra", nargs="*", help="training overrides after --, e.g. -- --train.global_batch 16")
    a = ap.parse_args(argv)
    from training.config import load_config
    from training.data.dataset import build_dataloader
    from training.job.trainer import Trainer

    # one directory for all ranks (a checkpoint is written by every rank into the same place)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT") or str(os.getppid())
    tmp = Path(tempfile.gettempdir()) / f"t5f-bench-{run_id}"
    tmp.mkdir(exist_ok=True)
    cfg = load_config(["--preset", a.preset, "--job.out_dir", str(tmp), "--checkpoint.keep_last", "1", *a.extra])
    cfg.train.steps = 10**9
    cfg.checkpoint.memory_interval = 1  # measured below, after the storage saves; idle until then
    trainer = Trainer(cfg)
    trainer.start_from_seed()
    try:
        t = cfg.train
        loader = iter(
            build_dataloader(
                trainer.dataset,
                cfg.data,
                seed=cfg.job.seed,
                global_batch=t.global_batch,
                rank=trainer.rank,
                world=trainer.world,
                start_offset=0,
                pin_memory=trainer.device.type == "cuda",
            )
        )

        def timed_step() -> tuple[float, int]:
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n_tok = trainer._step(next(loader))  # its loss and grad norm stay on the device (trainer.figures)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0, n_tok

        t0 = time.perf_counter()
        for _ in range(a.warmup):
            timed_step()
        warmup_s = time.perf_counter() - t0  # includes compiling, with parallel.compile on
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, toks = zip(*(timed_step() for _ in range(a.steps)))
        step_s = statistics.median(times)
        peak_gpu_gb = torch.cuda.max_memory_allocated() / 2**30 if trainer.device.type == "cuda" else None
        figures = {
            "preset": a.preset,
            "variant": " ".join(a.extra),
            "params": trainer.n_params,
            "world_size": trainer.world,
            "precision": cfg.parallel.precision,
            "global_batch": t.global_batch,
            "step_s": step_s,
            "tokens_per_s": statistics.median(toks) / step_s,
            "warmup_s": warmup_s,
            "peak_gpu_gb": peak_gpu_gb,
            **_throughput(trainer, cfg, step_s, a.peak_tflops),
        }
        if a.steps_only:
            _write(trainer, a.out, figures)
            return 0
        # The first async save allocates the reused host buffers (pinned on CUDA: seconds for a large model);
        # it is reported on its own, and the timed saves show the steady state every later save sees.
        step = 1
        async_first = trainer.ckpt.storage.save(step, trainer.state, force=True)
        trainer.ckpt.storage.wait()
        blocks: dict[str, list[float]] = {"async": [], "sync": [], "baseline": []}
        during_async: list[float] = []
        writes: list[float] = []  # async save call -> committed (background write + checksums + marker)
        checksums: list[float] = []  # this rank's share of the CRC32C checksums, inside that write
        for _ in range(a.saves):
            step += 1
            trainer.ckpt.storage.cfg.async_save = True
            t_save = time.perf_counter()
            blocks["async"].append(trainer.ckpt.storage.save(step, trainer.state, force=True))
            for _ in range(2):  # steps while the background write is in flight
                during_async.append(timed_step()[0])
            trainer.ckpt.storage.wait()
            writes.append(time.perf_counter() - t_save)
            checksums.append(trainer.ckpt.storage.checksum_s)
            step += 1
            blocks["sync"].append(trainer.ckpt.storage.save(step, trainer.state, force=True, sync=True))
            blocks["baseline"].append(_baseline_save(trainer, tmp / f"baseline_{step}.pt"))
        saves = bench_saves.measure(
            trainer,
            timed_step,
            step,
            steps=a.steps,
            saves=a.saves,
            first_blocked=async_first,
            later_blocked=blocks["async"],
        )
        step += a.saves
        memory = _memory_figures(trainer, timed_step, step, a.steps)
        memory.update(bench_copy.copy_figures(trainer, first_step=step + 10_000))
        if trainer.rank == 0:
            med = {k: statistics.median(v) for k, v in blocks.items()}
            res = {
                **figures,
                "step_s_during_async_write": statistics.median(during_async),
                "ckpt_block_s": med,
                "ckpt_block_over_step": {k: v / step_s for k, v in med.items()},
                "ckpt_block_first_async_s": async_first,
                "async_write_s": statistics.median(writes),
                "checksum_s": statistics.median(checksums),
                "checksum_over_async_write": statistics.median(checksums) / statistics.median(writes),
                "baseline_over_async": med["baseline"] / med["async"] if med["async"] else None,
                "ckpt_block_all_s": blocks,
                **saves,
                **memory,
                "snapshot_over_step": memory["snapshot_step_s"] / memory["snapshot_base_step_s"] - 1,
                "snapshot_block_over_step": memory["snapshot_block_s"] / memory["snapshot_base_step_s"],
                **_auto_interval(memory, cfg.checkpoint),
            }
            _write(trainer, a.out, res)
    finally:
        trainer._finished = True  # removes the bench's in-memory snapshots
        trainer.close()
        if int(os.environ.get("RANK", 0)) == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.bench report")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", default=None, help="write all results to this file")
    a = ap.parse_args(argv)
    rows = [json.loads(Path(f).read_text()) for f in a.files]
    saves = [r for r in rows if "ckpt_block_s" in r]  # --steps-only results have step figures alone
    if saves:
        _print_save_table(saves)
    if any("variant" in r for r in rows):
        _print_step_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
        print(f"\nwrote {a.json}")
    return 0


#: The ``variant`` of the plain Hugging Face baseline's rows (``training.bench_hf``).
BASELINE_VARIANT = "plain HF"


def vs_baseline(rows: list[dict]) -> list[float | None]:
    """Each row's tokens/s over the plain Hugging Face baseline's (``training.bench_hf``) of the same preset, device
    and global batch; None where there is no such baseline row."""

    def same(r: dict) -> tuple:
        return r["preset"], r["device"], r.get("global_batch")

    base = {same(r): r["tokens_per_s"] for r in rows if r.get("variant") == BASELINE_VARIANT}
    return [r["tokens_per_s"] / base[same(r)] if same(r) in base else None for r in rows]


def _print_step_table(rows: list[dict]) -> None:
    """One line per result: which settings (the training flags after --), step time, tokens/s, MFU, peak GPU
    memory, the warm-up steps' time (compiling happens there) and tokens/s as a multiple of plain HF's."""
    hdr = (
        f"{'preset':<10}{'device':>12}{'step s':>9}{'tok/s':>10}{'MFU':>7}{'peak GiB':>9}{'warmup s':>9}"
        f"{'vs HF':>7}  settings"
    )
    print(f"\n{hdr}\n{'-' * len(hdr)}")
    for r, ratio in zip(rows, vs_baseline(rows)):
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        peak = f"{r['peak_gpu_gb']:.1f}" if r.get("peak_gpu_gb") else "-"
        vs = "-" if ratio is None else f"{ratio:.2f}x"
        print(
            f"{r['preset']:<10}{r['device'][:11]:>12}{r['step_s']:>9.3f}{r['tokens_per_s']:>10,.0f}{mfu:>7}"
            f"{peak:>9}{r.get('warmup_s', float('nan')):>9.1f}{vs:>7}  {r.get('variant') or '(preset)'}"
        )


def _print_save_table(rows: list[dict]) -> None:
    hdr = (
        f"{'preset':<10}{'params':>8}{'world':>6}{'device':>12}{'step s':>9}{'tok/s':>10}{'MFU':>7}"
        f"{'1st async':>10}{'async s':>9}{'(%step)':>8}{'sync s':>8}{'(%step)':>8}{'base s':>8}{'(%step)':>8}"
        f"{'base/async':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        b, f = r["ckpt_block_s"], r["ckpt_block_over_step"]
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        print(
            f"{r['preset']:<10}{r['params'] / 1e6:>7.1f}M{r['world_size']:>6}{r['device'][:11]:>12}"
            f"{r['step_s']:>9.3f}{r['tokens_per_s']:>10,.0f}{mfu:>7}"
            f"{r.get('ckpt_block_first_async_s', float('nan')):>10.3f}"
            f"{b['async']:>9.3f}{100 * f['async']:>7.1f}%{b['sync']:>8.3f}{100 * f['sync']:>7.1f}%"
            f"{b['baseline']:>8.3f}{100 * f['baseline']:>7.1f}%{r['baseline_over_async']:>10.1f}x"
        )
    for r in rows:
        if "checksum_s" in r:
            print(
                f"{r['preset']}: checkpoint checksums (CRC32C, each rank its share, in the background writer) "
                f"{r['checksum_s']:.3f} s of the {r['async_write_s']:.2f} s async save = "
                f"{100 * r['checksum_over_async_write']:.1f}%"
            )
    for line in filter(None, map(bench_saves.report_line, rows)):
        print(line)
    for r in rows:
        if "snapshot_block_s" in r:
            print(
                f"{r['preset']}: in-memory snapshot every step: training blocked {r['snapshot_block_s']:.3f} s per "
                f"step = {100 * r['snapshot_block_over_step']:.1f}% of a step "
                f"({r['snapshot_bytes_per_rank'] / 1e6:,.0f} MB per rank, copied in {r['snapshot_copy_s']:.3f} s on "
                f"a thread overlapping the next step); step time {r['snapshot_step_s']:.3f} s vs "
                f"{r['snapshot_base_step_s']:.3f} s without ({100 * r['snapshot_over_step']:+.1f}%: the copy shares "
                f"the cores); restore {r['restore_memory_s']:.2f} s from memory vs {r['restore_storage_s']:.2f} s "
                "from storage"
            )
        for line in bench_copy.report_lines(r):
            print(line)
        if "snapshot_auto_interval" in r:
            n = r["snapshot_auto_interval"]
            print(
                f"{r['preset']}: memory_interval=auto takes {'every step' if n == 1 else f'every {n} steps'}: a "
                f"snapshot blocks {100 * r['snapshot_block_over_step']:.1f}% of a step (capture and wait for its "
                f"copy), {100 * r['snapshot_auto_share']:.2f}% of training time at that interval; budget "
                f"{100 * r['snapshot_budget']:g}% (checkpoint.memory_budget), at most every "
                f"{r['snapshot_max_interval']} steps (checkpoint.interval)"
            )
    for r in rows:
        if r["preset"] == "t5-60m":
            ok1 = r["ckpt_block_over_step"]["async"] <= 0.10
            ok2 = r["baseline_over_async"] >= 5
            print(
                f"\ntargets (t5-60m): async blocking <= 10% of a step: "
                f"{100 * r['ckpt_block_over_step']['async']:.1f}% {'MET' if ok1 else 'MISSED'}; "
                f">= 5x less blocking than baseline: {r['baseline_over_async']:.1f}x {'MET' if ok2 else 'MISSED'}"
            )
            if "snapshot_block_over_step" in r:
                ok3 = r["snapshot_block_over_step"] <= 0.03
                print(
                    f"target (t5-60m): in-memory snapshot every step blocks <= 3% of a step: "
                    f"{100 * r['snapshot_block_over_step']:.1f}% {'MET' if ok3 else 'MISSED'} (step time "
                    f"{100 * r['snapshot_over_step']:+.1f}%)"
                )
            print(
                f"note: while an async write is in flight a step takes {r['step_s_during_async_write']:.2f} s "
                f"(vs {r['step_s']:.2f} s): the writer shares the CPU cores"
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("run", "report"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return (run if argv[0] == "run" else report)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""The micro-batch a job should take, from memory measured on its GPU (issue 51, lever 5).

    python -m training.batch_fit --preset t5-large --nodes 2 --min-nodes 1 --nproc-per-node 8     # on a GPU
    python -m training.batch_fit --preset t5-large --nodes 2 --nproc-per-node 8 --measured fit.json   # anywhere

Measures, in one process (world 1), a rank's peak allocated GPU memory (``torch.cuda.max_memory_allocated``) over
one training step at each ``--probe`` micro-batch (after a first step that allocates the optimizer state), fits a
line through the peaks and prints the largest ``train.micro_batch`` that stays within ``--headroom`` of the GPU and
keeps the failover rule for the planned worlds (training.job.micro_batch_fit: it divides every planned world's
per-rank share, so survivors run more micro-batches of the same size, never larger ones). The planned worlds are
the launcher's: ``--nodes`` (MAX), ``--min-nodes`` (MIN, default ``T5_MIN_NODES`` or 1, as the launcher),
``--nproc-per-node``. Training flags after ``--`` (precision, activation checkpointing, attention) are the job's,
so the model measured is the one that runs. Measured at world 1, the state is whole: a rank of a larger world holds
a shard of it, so the fit is on the safe side there.

No CUDA: it refuses in one line (exit 3): the CPU has no allocator peak that stands for a GPU's. ``--measured FILE``
takes the figures of an earlier GPU run (its ``--out``) and only chooses, for another plan, on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from training.job.micro_batch_fit import Choice, FitError, JobPlan, choose, fit_line

DEFAULT_PROBES = (2, 4, 8)
EXIT_NO_GPU = 3


def measure_peaks(cfg, probes: list[int]) -> dict:
    """Peak allocated GB of one training step at each probe micro-batch, on this process's GPU (world 1)."""
    import torch

    from training.data.dataset import build_dataloader
    from training.job.trainer import Trainer

    cfg.train.global_batch = max(probes)
    cfg.train.micro_batch = 0
    cfg.train.steps = 10**9
    trainer = Trainer(cfg)
    trainer.start_from_seed()
    try:
        loader = build_dataloader(
            trainer.dataset, cfg.data, seed=cfg.job.seed, global_batch=max(probes), rank=0, world=1, start_offset=0
        )
        batch = next(iter(loader))
        peaks, reserved = {}, {}
        for i, m in enumerate(sorted(probes)):
            part = {k: v[:m] for k, v in batch.items()}
            if i == 0:
                trainer._step(part)  # the first step allocates the optimizer state; every later peak holds it
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            trainer._step(part)
            torch.cuda.synchronize()
            peaks[m] = torch.cuda.max_memory_allocated() / 2**30
            reserved[m] = torch.cuda.max_memory_reserved() / 2**30
        return {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "capacity_gb": torch.cuda.get_device_properties(trainer.device).total_memory / 2**30,
            "measured_world": trainer.world,
            "peaks_gb": peaks,
            "reserved_gb": reserved,
        }
    finally:
        trainer._finished = True
        trainer.close()


def read_measured(path: str) -> dict:
    """The figures of an earlier GPU run (its --out); FitError in one line when the file is not one."""
    try:
        figures = json.loads(Path(path).read_text())
        figures["peaks_gb"] = {int(m): float(gb) for m, gb in figures["peaks_gb"].items()}
        figures["capacity_gb"] = float(figures["capacity_gb"])
        figures.setdefault("device", "?")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise FitError(f"--measured {path} is not a batch_fit --out file ({e}): pass the --out of a GPU run") from None
    return figures


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m training.batch_fit",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", default="t5-large")
    ap.add_argument("--nodes", type=int, required=True, help="MAX nodes of the job (the launcher's --nodes)")
    ap.add_argument(
        "--min-nodes",
        type=int,
        default=int(os.environ.get("T5_MIN_NODES") or 1),
        help="MIN nodes it keeps training with (the launcher's --min-nodes; default T5_MIN_NODES or 1)",
    )
    ap.add_argument("--nproc-per-node", type=int, required=True, help="ranks (GPUs) per node")
    ap.add_argument(
        "--probe", type=int, nargs="+", default=list(DEFAULT_PROBES), help="micro-batches measured (default 2 4 8)"
    )
    ap.add_argument("--headroom", type=float, default=0.1, help="share of the GPU kept free (default 0.1)")
    ap.add_argument("--measured", help="a GPU run's --out: choose from its figures instead of measuring")
    ap.add_argument("--out", help="write the figures and the choice here (JSON)")
    ap.add_argument("extra", nargs="*", help="the job's training flags after --, e.g. -- --parallel.compile on")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from training.config import ConfigError, load_config

    try:
        cfg = load_config(["--preset", a.preset, *a.extra])
        plan = JobPlan(cfg.train.global_batch, a.min_nodes, a.nodes, a.nproc_per_node)
        plan.check()  # a plan no world can run is said before any GPU time is spent
        if a.measured:
            figures = read_measured(a.measured)
        else:
            import torch

            if not torch.cuda.is_available():
                print(
                    f"batch_fit: no CUDA device visible (torch {torch.__version__}): the fit needs a GPU's "
                    "allocator peaks; run it on a GPU machine, or pass --measured FILE (a GPU run's --out)",
                    file=sys.stderr,
                )
                return EXIT_NO_GPU
            if any(m < 1 for m in a.probe) or len(set(a.probe)) < 2:
                raise FitError(f"--probe {' '.join(map(str, a.probe))}: give two sizes or more, each >= 1, e.g. 2 4 8")
            with tempfile.TemporaryDirectory(prefix="t5f-batch-fit-") as tmp:
                cfg.job.out_dir = tmp
                cfg.checkpoint.dir = os.path.join(tmp, "checkpoints")
                cfg.metrics.path = os.path.join(tmp, "metrics.jsonl")
                cfg.checkpoint.memory_interval = 0  # no snapshot buffers in the peaks
                figures = measure_peaks(cfg, a.probe)
        line = fit_line(figures["peaks_gb"])
        fitting = line.largest_fitting(figures["capacity_gb"], a.headroom)
        choice = choose(plan, fitting)
    except (ConfigError, FitError) as e:
        print(f"batch_fit: {e}", file=sys.stderr)
        return 2
    print(report_line(a.preset, figures, line, a.headroom, choice))
    if a.out:
        record = {
            **figures,
            "preset": a.preset,
            "variant": " ".join(a.extra),
            "headroom": a.headroom,
            "fixed_gb": line.fixed_gb,
            "per_sample_gb": line.per_sample_gb,
            "fitting": fitting,
            "predicted_peak_gb": line.peak_gb(choice.micro_batch),
            "micro_batch": choice.micro_batch,
            "plan": {
                "global_batch": plan.global_batch,
                "min_nodes": a.min_nodes,
                "max_nodes": a.nodes,
                "nproc_per_node": a.nproc_per_node,
            },
        }
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(record, indent=1))
    return 0


def report_line(preset: str, figures: dict, line, headroom: float, choice: Choice) -> str:
    """What was measured, the line through it, and the choice with its reason."""
    peaks = ", ".join(f"{m}: {gb:.2f}" for m, gb in sorted(figures["peaks_gb"].items()))
    return (
        f"{preset} on {figures['device']} ({figures['capacity_gb']:.1f} GB, {100 * headroom:g}% kept free): peak GB at "
        f"micro-batch {peaks} -> {line.fixed_gb:.2f} + {line.per_sample_gb:.3f} x m; predicted peak at "
        f"{choice.micro_batch}: {line.peak_gb(choice.micro_batch):.2f} GB\n{choice.line()}"
    )


if __name__ == "__main__":
    sys.exit(main())

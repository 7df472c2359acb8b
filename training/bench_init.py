"""Model-build benchmark (figures, not assertions): what each rank pays to get its shards of a fresh model.

Two ways, each under torchrun with NPROC ranks on this machine's CPU: ``cpu`` builds the whole model on every
rank and then shards it (the old path, still used for ``model.init_from``); ``meta`` builds on the meta device
and materialises only the rank's shards (training.model.meta_init, the trainer's path). Prints seconds and peak
resident memory per rank; both give bitwise the same weights (tests/unit/training/test_meta_init.py,
tests/integration/training/test_meta_init.py).

    python -m training.bench_init --preset t5-large --nproc 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from training.job.lifecycle import exit_without_finalization


def worker(preset: str, mode: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.config import load_config
    from training.model.t5 import BuiltOnCpu, apply_fsdp, build_model, build_model_for_sharding

    dist.init_process_group("gloo")
    cfg = load_config(["--preset", preset])
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    built = (
        build_model_for_sharding(cfg.model, seed=cfg.job.seed)
        if mode == "meta"
        else BuiltOnCpu(build_model(cfg.model, seed=cfg.job.seed))
    )
    apply_fsdp(built.model, init_device_mesh("cpu", (dist.get_world_size(),)), cfg.parallel)
    built.materialize(built.model, torch.device("cpu"))
    seconds = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB
    Path(out, f"{mode}-{dist.get_rank()}.json").write_text(json.dumps({"seconds": seconds, "peak_gb": peak_gb}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.bench_init", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="t5-60m", help="model shape (training/presets), default t5-60m")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (processes) on this machine, default 2")
    ap.add_argument("--modes", default="cpu,meta", help="comma-separated: cpu, meta (default both)")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.preset, *a.worker)
        exit_without_finalization(0)
    modes = a.modes.split(",")
    if bad := [m for m in modes if m not in ("cpu", "meta")]:
        ap.error(f"--modes: unknown mode {bad[0]!r}; use cpu and/or meta")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    print(f"{'preset':<10}{'ranks':>6}{'mode':>6}{'build s':>9}{'peak GB/rank':>14}")
    with tempfile.TemporaryDirectory() as out:
        for mode in modes:
            print(f"[bench_init] {a.preset}: {mode} build on {a.nproc} ranks ...", file=sys.stderr, flush=True)
            r = subprocess.run(
                [
                    torchrun,
                    "--standalone",
                    f"--nproc_per_node={a.nproc}",
                    "-m",
                    "training.bench_init",
                    "--preset",
                    a.preset,
                    "--worker",
                    mode,
                    out,
                ],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                capture_output=True,
                text=True,
            )
            if r.returncode:
                print(r.stdout[-2000:] + r.stderr[-4000:], file=sys.stderr)
                return r.returncode
            ranks = [json.loads(Path(out, f"{mode}-{i}.json").read_text()) for i in range(a.nproc)]
            print(
                f"{a.preset:<10}{a.nproc:>6}{mode:>6}{max(x['seconds'] for x in ranks):>9.1f}"
                f"{max(x['peak_gb'] for x in ranks):>14.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

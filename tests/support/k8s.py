"""Render the TrainJob + runtime the way a user does (the submit CLI's dry run) and load them."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from unittest import mock

import yaml

# 2 pods x 1 CPU process: what a user passes to run the GPU job shape on CPU-only nodes.
CPU_SHAPE = [
    "--nodes",
    "2",
    "--nproc-per-node",
    "1",
    "--gpus-per-node",
    "0",
    "--efa-per-node",
    "0",
    "--memory",
    "2Gi",
    "--preset",
    "debug",
]


def submit_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m tools.k8s.submit ARGS` run in-process (same code path as the CLI, ~1 s cheaper)."""
    from tools.k8s import submit

    out, err = io.StringIO(), io.StringIO()
    if env is None:  # the ambient environment, minus what the Makefile may export (tests say it explicitly)
        env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "NODES", "NPROC", "PRESET", "SPARES")}
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = submit.main(list(args))
    return subprocess.CompletedProcess(["submit", *args], rc, out.getvalue(), err.getvalue())


def render(name: str, *training_args: str, cli: tuple[str, ...] = ()) -> tuple[dict, dict, str]:
    """(runtime, trainjob, yaml text) from `submit --dry-run --print-runtime` with the CPU shape."""
    r = submit_cli(
        "--dry-run",
        "--print-runtime",
        "--name",
        name,
        "--image",
        "t5-failover-train:test",
        *CPU_SHAPE,
        *cli,
        "--",
        *training_args,
    )
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    kinds = {d["kind"]: d for d in docs}
    return kinds["ClusterTrainingRuntime"], kinds["TrainJob"], r.stdout

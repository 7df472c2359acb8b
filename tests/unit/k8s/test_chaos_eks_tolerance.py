"""The EKS chaos test's weight check: bitwise on CPU pods, a stated tolerance on GPU pods by default (two
uninterrupted GPU runs already differ by ~1e-7, docs/failover.md), and --atol wins either way."""

from __future__ import annotations

import contextlib
import io
import os
from unittest import mock

import pytest

from chaos import eks
from tests.support.k8s import CPU_SHAPE


def plan_line(*args: str) -> tuple[int, str, str]:
    """`python -m chaos.eks --dry-run ARGS` in-process: (exit code, the plan's first line, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "NODES", "NPROC", "PRESET", "SPARES")}
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = eks.main(["--dry-run", "--image", "t5:1", "--name", "tol", *args])
    return rc, (out.getvalue().splitlines() or [""])[0], err.getvalue()


def test_gpu_pods_get_the_gpu_tolerance_by_default():
    rc, line, _ = plan_line()  # the default instance type: 8 GPUs per pod
    assert rc == 0 and line.endswith(f"weights vs the reference within {eks.GPU_WEIGHT_ATOL:g} (GPU pods)")


def test_cpu_pods_are_compared_bitwise_by_default():
    rc, line, _ = plan_line(*CPU_SHAPE)
    assert rc == 0 and line.endswith("weights vs the reference bitwise")


@pytest.mark.parametrize("atol, shape, want", [("0", (), "bitwise"), ("1e-5", CPU_SHAPE, "within 1e-05")])
def test_an_explicit_atol_wins(atol, shape, want):
    rc, line, _ = plan_line("--atol", atol, *shape)
    assert rc == 0 and want in line


def test_a_negative_atol_is_one_line_exit_2():
    rc, line, err = plan_line("--atol", "-1")
    assert rc == 2 and line == ""
    assert err == "error: --atol -1: use 0 (bitwise) or a positive tolerance, e.g. 1e-06 on GPUs\n"


def test_the_tolerance_reaches_every_scenarios_expectation():
    gpu = eks.weight_tolerance(None, gpus_per_node=8)
    assert gpu == eks.GPU_WEIGHT_ATOL and eks.weight_tolerance(None, gpus_per_node=0) == 0.0
    for sc in eks.scenarios(interval=25, gang=False, atol=gpu).values():
        assert (sc.expect.outcome, sc.expect.atol) == ("close", gpu)
    for sc in eks.scenarios(interval=25, gang=False, atol=0.0).values():
        assert sc.expect.outcome != "close"

"""`make train` (scripts/train.sh) locally: a --preset among ARGS is the preset the run uses, says and passes once."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT


def dry_run(*args: str, **env: str) -> str:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PRESET", "NODES", "NPROC", "SPARES", "PLATFORM", "MAX_RESTARTS")
    }
    r = subprocess.run(
        ["scripts/train.sh", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "DRY_RUN": "1", **env},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(
    "args", [("--preset", "t5-small"), ("--preset=t5-small",), ("--train.steps", "3", "--preset", "t5-small")]
)
def test_a_preset_in_the_arguments_is_the_one_run_and_passed_once(args):
    line = dry_run(*args).strip()
    assert line.startswith("[train] dry run: ") and "-m training " in line
    assert line.count("--preset") == 1 and "t5-small" in line and "debug" not in line
    banner = dry_run(*args, NODES="2").splitlines()[0]  # the simulated-nodes launcher
    assert banner.startswith("[train] dry run: preset=t5-small, 2 simulated node(s)")


def test_without_one_the_preset_variable_or_debug_is_passed():
    assert dry_run().rstrip().endswith("-m training --preset debug")
    assert dry_run(PRESET="t5-small").rstrip().endswith("-m training --preset t5-small")


def test_a_failed_worker_group_restarts_max_restarts_times_and_a_bad_value_is_one_line():
    assert "--max_restarts=3 " in dry_run() and "--max_restarts=0 " in dry_run(MAX_RESTARTS="0")
    clean = {k: v for k, v in os.environ.items() if k not in ("PLATFORM", "NODES", "SPARES")}
    r = subprocess.run(
        ["scripts/train.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "MAX_RESTARTS": "three"},
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: MAX_RESTARTS=three must be 0 or a positive integer (worker-group restarts)"
    ], r.stderr

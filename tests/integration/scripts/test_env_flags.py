"""DRY_RUN means the same everywhere: one parser (tools/env_flags.py), and every entry point that reads it.

Each entry point runs (the script its `make` target runs, to see its own exit status) with every spelling. A dry run
must print what it would do and exit 0; a real run must get past the decision and stop at once for lack of a cluster
(no kubeconfig, no sbatch on PATH, no AWS credentials), which nothing here has; a bad value must stop with exit 2
naming the variable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tools.env_flags import EnvFlagError, env_count, env_flag, parse_flag

ROOT = Path(__file__).resolve().parents[3]
TRUE_SPELLINGS = ("1", "true", "YES", "On")
FALSE_SPELLINGS = ("0", "false", "No", "OFF", "", None)  # None: unset
BAD = "maybe"


def test_truth_table() -> None:
    for v in (*TRUE_SPELLINGS, " yes "):
        assert parse_flag("DRY_RUN", v) is True, v
    for v in FALSE_SPELLINGS:
        assert parse_flag("DRY_RUN", v) is False, v
    for v in (BAD, "2", "y", "n", "enable", "-1"):
        with pytest.raises(
            EnvFlagError,
            match=rf"DRY_RUN='{v}' is neither true nor false: use 1/true/yes/on .* "
            r"0/false/no/off or empty",
        ):
            parse_flag("DRY_RUN", v)
    assert env_flag("X", {"X": "on"}) and not env_flag("X", {})


def test_counts_name_the_variable() -> None:
    assert env_count("NODES", 2, 1, {}) == 2 and env_count("NODES", 2, 1, {"NODES": ""}) == 2
    assert env_count("SPARES", 0, 0, {"SPARES": "0"}) == 0 and env_count("NODES", None, 1, {"NODES": " 3 "}) == 3
    for bad in ("abc", "0", "-1", "1.5"):
        with pytest.raises(EnvFlagError, match=f"NODES='{bad}' is not a whole number >= 1: set it to a count"):
            env_count("NODES", 2, 1, {"NODES": bad})


@pytest.mark.parametrize("var", ["NODES", "NPROC"])
def test_chaos_cli_names_a_bad_count_in_one_line(var: str) -> None:
    """python -m chaos.local read them with int(): a traceback (make chaos-test checks them in chaos.sh first)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NODES", "NPROC", "SOAK")}
    r = subprocess.run(
        [sys.executable, "-m", "chaos.local", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env, var: "abc"},
        timeout=60,
    )
    assert (r.returncode, r.stderr) == (
        2,
        f"error: {var}='abc' is not a whole number >= 1: set it to a count, or unset it\n",
    )


def test_shell_form_prints_true_or_false_and_exits_2_on_a_bad_value() -> None:
    def run(value: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["python3", "-m", "tools.env_flags", "DRY_RUN"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "DRY_RUN": value},
            timeout=30,
        )

    assert run("Yes").stdout == "true\n" and run("off").stdout == "false\n"
    bad = run(BAD)
    assert bad.returncode == 2 and bad.stdout == "" and "DRY_RUN='maybe'" in bad.stderr


@dataclass(frozen=True)
class EntryPoint:
    """`make <target>` with ``env``; ``dry``/``real`` tell from its output which path it took."""

    target: str
    env: dict[str, str]
    dry: Callable[[subprocess.CompletedProcess], bool]
    real: Callable[[subprocess.CompletedProcess], bool]
    args: str = ""
    slow_real: bool = False  # the real path starts torchrun before it can fail (an e2e test then)
    extra: dict[str, str] = field(default_factory=dict)


def out(p: subprocess.CompletedProcess) -> str:
    return p.stdout + p.stderr


ENTRY_POINTS = {
    # make train (local): the torchrun command; real: torchrun starts and the unknown preset stops the worker.
    "train-local": EntryPoint(
        "train",
        {"PLATFORM": "local", "NPROC": "1", "PRESET": "no-such-preset"},
        dry=lambda p: p.returncode == 0 and "[train] dry run:" in p.stdout,
        real=lambda p: (
            p.returncode != 0 and "[train] local run" in p.stdout and "unknown preset 'no-such-preset'" in out(p)
        ),
        slow_real=True,
    ),
    # make train PLATFORM=slurm: the batch script; real: no sbatch on this PATH (exit 3).
    "train-slurm": EntryPoint(
        "train",
        {"PLATFORM": "slurm"},
        dry=lambda p: p.returncode == 0 and p.stdout.startswith("#!/bin/bash"),
        real=lambda p: p.returncode == 3 and "sbatch not found" in p.stderr,
    ),
    # make train PLATFORM=eks: the TrainJob YAML; real: no kubeconfig (exit 2).
    "train-eks": EntryPoint(
        "train",
        {"PLATFORM": "eks"},
        dry=lambda p: p.returncode == 0 and "kind: TrainJob" in p.stdout,
        real=lambda p: p.returncode == 2 and "no kubeconfig" in p.stderr,
    ),
    # make chaos-test (local): the plan; real: the run refuses an output directory that is a file (the dry run
    # writes nothing there, so it does not check it).
    "chaos-local": EntryPoint(
        "chaos-test",
        {"PLATFORM": "local"},
        args="--out {file}",
        dry=lambda p: p.returncode == 0 and p.stdout.startswith("config: LocalChaosConfig"),
        real=lambda p: p.returncode == 2 and p.stderr.startswith("error: --out ") and ": not a directory" in p.stderr,
    ),
    # make chaos-test PLATFORM=eks: the plan and the TrainJob; real: no kubeconfig.
    "chaos-eks": EntryPoint(
        "chaos-test",
        {"PLATFORM": "eks"},
        dry=lambda p: p.returncode == 0 and p.stdout.startswith("# chaos plan"),
        real=lambda p: p.returncode == 2 and "no kubeconfig" in p.stderr,
    ),
    # make chaos-test PLATFORM=slurm has no dry run: DRY_RUN true is refused; false runs it (here: its --help).
    "chaos-slurm": EntryPoint(
        "chaos-test",
        {"PLATFORM": "slurm"},
        args="--help",
        dry=lambda p: p.returncode == 2 and "the Slurm chaos test has no dry run" in p.stderr,
        real=lambda p: p.returncode == 0 and "usage: " in p.stdout,
    ),
    # make image: the docker/aws commands; real: no reachable Docker daemon or no AWS credentials (exit 2).
    "image": EntryPoint(
        "image",
        {},
        args="--tag env-flag-test",
        dry=lambda p: p.returncode == 0 and "+ docker build" in p.stdout,
        real=lambda p: p.returncode == 2 and "+ docker build" not in p.stdout and p.stderr.startswith("error: "),
    ),
}


#: make target -> the script it runs (Makefile: `@scripts/<script> $(ARGS)`, with the variables exported).
SCRIPTS = {"train": "train.sh", "chaos-test": "chaos.sh", "image": "image.sh"}


def run_make(ep: EntryPoint, base: dict[str, str], value: str | None) -> subprocess.CompletedProcess:
    env = {**base, **ep.env}
    if value is not None:
        env["DRY_RUN"] = value
    args = ep.args.format(file=base["OUT_FILE"]).split()
    return subprocess.run(
        [str(ROOT / "scripts" / SCRIPTS[ep.target]), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_point_reads_dry_run_with_the_shared_truth_table(name: str, isolated: dict[str, str]) -> None:
    ep = ENTRY_POINTS[name]
    cases = [(v, True) for v in TRUE_SPELLINGS] + [(v, False) for v in FALSE_SPELLINGS if not ep.slow_real]
    cases.append((BAD, None))
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: run_make(ep, isolated, c[0]), cases))
    for (value, dry), p in zip(cases, results):
        shown = f"DRY_RUN={value!r}: rc={p.returncode}\n{out(p)[-1500:]}"
        if dry is None:
            assert p.returncode == 2 and "DRY_RUN='maybe' is neither true nor false" in p.stderr, shown
        elif dry:
            assert ep.dry(p) and not ep.real(p), shown
        else:
            assert ep.real(p) and not ep.dry(p), shown

"""What `make train` / `make chaos-test` return: GNU make exits 2 for any failed recipe; the script's own code is
in make's "Error N" line and in the one line the recipe prints before it, with its meaning and how to get the code
as an exit status (call the script directly). README, docs/slurm.md and docs/kubernetes.md say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ENV = {k: v for k, v in os.environ.items() if k not in ("PLATFORM", "DRY_RUN", "ARGS", "MAKEFLAGS", "MAKELEVEL")}


def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=ROOT, env={**ENV, **env}, capture_output=True, text=True, timeout=120)


def test_make_returns_2_and_names_the_scripts_own_code_with_its_meaning(tmp_path) -> None:
    # the Slurm submit's code 3 (no shared directory): fast, no job runs
    args = f"--shared-dir {tmp_path / 'missing'} --no-follow"
    direct = run("scripts/train.sh", *args.split(), PLATFORM="slurm")
    assert direct.returncode == 3, direct.stderr
    r = run("make", "train", "PLATFORM=slurm", f"ARGS={args}")
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert lines[-2] == (
        "[make] scripts/train.sh exited 3: no Slurm (sbatch missing) or no shared directory "
        "(README, exit codes); make itself exits 2 for any failed recipe, so run scripts/train.sh "
        "directly (same variables and arguments) to get 3 as the exit status"
    ), r.stderr
    assert lines[-1].startswith("make: *** [Makefile:") and lines[-1].endswith("train] Error 3")


def test_a_successful_target_prints_no_exit_line() -> None:
    r = run("make", "train", "DRY_RUN=1")
    assert r.returncode == 0 and "[make]" not in r.stderr, r.stderr


def test_each_training_code_has_its_meaning() -> None:
    # the README table's codes, as the local job returns them (the helper the recipes call, alone)
    for rc, meaning in (
        (2, "invalid configuration"),
        (3, "another model shape"),
        (4, "other settings"),
        (5, "diverged"),
        (6, "storage failed"),
        (7, "in use by another run"),
        (130, "Ctrl-C"),
    ):
        r = run("scripts/train_exit.sh", "train", str(rc), PLATFORM="local")
        assert r.returncode == rc and f"exited {rc}: " in r.stderr and meaning in r.stderr, r.stderr
    r = run("scripts/train_exit.sh", "chaos-test", "1", PLATFORM="eks")
    assert r.returncode == 1 and "scripts/chaos.sh exited 1: a scenario failed its checks" in r.stderr
    r = run("scripts/train_exit.sh", "train", "1", PLATFORM="eks")
    assert r.returncode == 1 and "the TrainJob failed" in r.stderr


def test_after_a_stop_makes_line_agrees_with_the_jobs_line_on_where_a_rerun_resumes(tmp_path) -> None:
    # A Ctrl-C before the first checkpoint: scripts/train.sh prints tools/resume_point's line ("stopped before any
    # checkpoint was saved ... starts from the beginning"); make's line then said "after checkpointing (rerun
    # resumes)". It now points at that line, the one that knows.
    job = run(sys.executable, "-m", "tools.resume_point", "--preset", "debug", "--job.out_dir", str(tmp_path / "run"))
    assert job.returncode == 0 and job.stdout.startswith("stopped before any checkpoint was saved"), job.stderr
    for rc, stop in ((130, "Ctrl-C"), (143, "a signal")):
        r = run("scripts/train_exit.sh", "train", str(rc), PLATFORM="local")
        assert r.returncode == rc and r.stderr.startswith(
            f"[make] scripts/train.sh exited {rc}: stopped by {stop} (the [train] line above says where a rerun "
            f"resumes) "
        ), r.stderr
        assert "after checkpointing" not in r.stderr, r.stderr
    # on a cluster Ctrl-C stops following: the job keeps running, nothing was stopped or checkpointed by it
    for platform in ("slurm", "eks"):
        r = run("scripts/train_exit.sh", "train", "130", PLATFORM=platform)
        assert r.returncode == 130 and "stopped following by Ctrl-C; the job keeps running" in r.stderr, r.stderr

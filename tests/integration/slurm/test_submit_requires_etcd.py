"""`make train PLATFORM=slurm` (scripts/train_slurm.sh) refuses a job that has no etcd before it is queued, in the
terminal that submits it, and submits it with REQUIRE_ETCD=0 or with T5_ETCD_* set. No Slurm lab: sbatch on PATH is
a recorder that answers a job id (what the submit does before and after sbatch is what is tested)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import ROOT

ETCD_VARS = ("T5_ETCD_ENDPOINTS", "T5_ETCD_CA", "T5_ETCD_CERT", "T5_ETCD_KEY", "T5_ETCD_ROOT_PASSWORD_FILE")


def submit(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    bindir, calls = tmp_path / "bin", tmp_path / "sbatch-calls"
    if not bindir.is_dir():
        bindir.mkdir()
        (bindir / "sbatch").write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho 4242\n')
        (bindir / "sbatch").chmod(0o755)
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_CONF", "SHARED_DIR", "NODES", "PRESET", "DRY_RUN", "REQUIRE_ETCD", *ETCD_VARS)
    }
    proc = subprocess.run(
        [str(ROOT / "scripts/train_slurm.sh"), "--shared-dir", str(tmp_path), "--run-name", "r", "--no-follow", *args],
        cwd=ROOT,
        env={**base, "SLAB_ROOT": str(tmp_path / "no-lab"), "PATH": f"{bindir}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, calls


def test_a_job_without_etcd_is_refused_before_sbatch(tmp_path):
    proc, calls = submit(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: this job has no etcd membership store (neither --etcd-env nor T5_ETCD_ENDPOINTS")
    assert "REQUIRE_ETCD=0" in line
    assert not calls.exists() and not (tmp_path / "runs" / "r" / "job.sbatch").exists()  # nothing queued or written


def test_the_opt_out_and_the_etcd_settings_submit(tmp_path):
    proc, calls = submit(tmp_path, REQUIRE_ETCD="0")
    assert proc.returncode == 0 and "[train-slurm] submitted job 4242" in proc.stdout, proc.stderr
    proc, calls = submit(tmp_path, "--no-require-etcd")
    assert proc.returncode == 0, proc.stderr
    proc, calls = submit(tmp_path, T5_ETCD_ENDPOINTS="https://10.0.1.10:2379")
    assert proc.returncode == 0, proc.stderr
    assert len(calls.read_text().splitlines()) == 3


def test_a_dry_run_prints_the_script_and_says_a_submit_would_be_refused(tmp_path):
    proc, calls = submit(tmp_path, DRY_RUN="1")
    assert proc.returncode == 0 and proc.stdout.startswith("#!/bin/bash"), proc.stderr
    assert "warning: a submit would be refused: this job has no etcd membership store" in proc.stderr
    assert not calls.exists()

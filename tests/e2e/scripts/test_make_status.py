"""`make status` (scripts/status.sh -> python -m tools.status) on real local runs of `make train`: a finished
run, and one while it runs and after it was stopped; `make train` ends with the goodput ledger's summary line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.e2e
ENV = {k: v for k, v in os.environ.items() if k not in ("NPROC", "NODES", "PRESET", "PLATFORM")} | {
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


def make_status(out: Path) -> str:
    r = subprocess.run(
        ["make", "-s", "status", f"ARGS=--job.out_dir {out}"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def field(screen: str, name: str) -> str:
    return next(line[9:] for line in screen.splitlines() if line.startswith(f"{name:<9}"))


def step_records(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return [
        r
        for r in map(json.loads, lines[:-1] if lines and not lines[-1].endswith("}") else lines)
        if r["event"] == "step"
    ]


def test_a_finished_run(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        ["bash", "scripts/train.sh", *TINY, "--job.out_dir", str(out), "--train.steps", "4"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = r.stdout.splitlines()[-1]  # make train's last line: the ledger's summary
    assert summary.startswith("[goodput] ") and "no failures" in summary and str(out) in summary, r.stdout[-800:]
    screen = make_status(out)
    assert field(screen, "job") == f"{out} (local): finished"
    assert field(screen, "step").startswith("4/4 (100%)  ETA -")
    assert field(screen, "world").startswith("2 ranks") and field(screen, "failure") == "none"
    ledger = json.loads(_ledger(out))
    assert ledger["useful_s"] == pytest.approx(sum(s["step_time_s"] for s in step_records(out)), abs=0.002)
    assert field(screen, "goodput").startswith(f"{ledger['goodput']:.0%} so far")


def test_a_finished_simulated_multi_node_run_ends_with_the_goodput_line_too(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        ["bash", "scripts/train.sh", *TINY, "--job.out_dir", str(out), "--train.steps", "3"],
        cwd=ROOT,
        env=ENV | {"NODES": "2", "NPROC": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 simulated node(s) x 1 processes" in r.stdout  # the launcher's path, not torchrun --standalone
    summary = r.stdout.splitlines()[-1]
    assert summary.startswith("[goodput] ") and "no failures" in summary and str(out) in summary, r.stdout[-800:]


def _ledger(out: Path) -> str:
    r = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "training.goodput", str(out), "--json", "--no-png"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_running_run_then_stopped(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "train.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [
                "bash",
                "scripts/train.sh",
                *TINY,
                "--job.out_dir",
                str(out),
                "--train.steps",
                "400",
                "--checkpoint.interval",
                "100",
            ],
            cwd=ROOT,
            env=ENV,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while len(step_records(out)) < 4:  # past the first step (warm-up): a speed and an ETA exist
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "no 4 steps within 180 s"
            time.sleep(0.2)
        screen = make_status(out)
        assert field(screen, "job") == f"{out} (local): running", screen
        done = int(re.match(r"(\d+)/400 \(\d+%\)  ETA (\d+ min )?\d+ s", field(screen, "step")).group(1))
        assert done >= 4
        assert re.match(r"[\d,]+ tokens/s, [\d.]+ s/step", field(screen, "speed")), screen
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: checkpoint at the next step, exit 130
        proc.wait(timeout=120)
    assert proc.returncode == 130, log.read_text()[-2000:]
    screen = make_status(out)
    assert field(screen, "job") == f"{out} (local): not running (stopped)", screen
    assert field(screen, "step").startswith(f"{step_records(out)[-1]['step']}/400") and "ETA -" in field(screen, "step")

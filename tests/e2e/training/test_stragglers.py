"""Straggler detection: the rule on work times measured on this machine, the work clock on a real FSDP2 model, the
notes between an agent and its workers."""

from __future__ import annotations

import os
import time

import pytest


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(parent, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        found = kids.get(todo.pop(), [])
        out += found
        todo += found
    return out


@pytest.mark.e2e
def test_without_a_spare_a_straggler_is_named_and_the_job_keeps_its_size(tmp_path):
    """A real 2-rank job (no hot spare) whose rank 1 is stopped 0.4 s of every 0.5 s from its first step on: the job
    names rank 1 in one line and a straggler event, says no spare waits, and finishes at world 2 in one attempt.
    (0.2 s of every 0.3 s read 1.5-4.3x on a quiet machine, and in CI, with another test on the second core, it
    once stayed under 2x for the whole run: at a fifth of its speed the straggler reads well above 2x under load.)"""
    import json
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT
    from training.job.lifecycle import worker_rank

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.launch.agent",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "training",
            "--preset",
            "debug",
            "--job.out_dir",
            str(tmp_path),
            "--train.steps",
            "8",
            "--checkpoint.interval",
            "8",
            "--parallel.threads",
            "1",
            "--straggler.steps",
            "2",
            "--straggler.skip_steps",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while not (metrics.exists() and '"event": "step"' in metrics.read_text()):  # the first step is logged
            assert job.poll() is None and time.monotonic() < deadline, "the job ended or never trained"
            time.sleep(0.1)
        slow = next(p for p in _descendants(job.pid) if worker_rank(p) == 1)  # this job's own rank 1 only
        while job.poll() is None and time.monotonic() < deadline:
            try:
                os.kill(slow, signal.SIGSTOP)
                time.sleep(0.4)
                os.kill(slow, signal.SIGCONT)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    finally:
        if job.poll() is None:
            try:
                os.kill(slow, signal.SIGCONT)
            except (NameError, ProcessLookupError):
                pass
        out = job.communicate(timeout=120)[0]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert job.returncode == 0, out[-3000:]
    named = [r for r in records if r["event"] == "straggler"]
    assert named and {r["rank"] for r in named} == {1}, (named, out[-3000:])
    assert named[0]["action"] == "no hot spare waits: the job keeps its size" and named[0]["ratio"] >= 2
    assert "[straggler] rank 1 (node 0, host" in out and "no hot spare waits" in out
    assert [r["world_size"] for r in records if r["event"] == "step"] == [2] * 8
    assert len([r for r in records if r["event"] == "start"]) == 1  # one attempt: nobody was taken out

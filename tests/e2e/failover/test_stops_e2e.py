"""End to end: clean stops of real runs (scripts/train.sh = `make train`, `python -m training.launch`).

Ctrl-C is a SIGINT to the launcher's process group, as a terminal sends it (each run starts in its own
session). Processes are found through /proc: a run's workers carry its unique out_dir in their command line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, TORCHRUN
from training.checkpoint import latest_complete, parse_step
from training.job.lifecycle import worker_rank

pytestmark = pytest.mark.e2e
# scripts/train.sh: PRESET debug, NPROC 2 (its defaults); the local launcher: NODES 2 (flag), NPROC 1
ENV = {k: v for k, v in os.environ.items() if k not in ("NPROC", "NODES", "PRESET")} | {
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}
LONG = 400  # train.steps of a run that is stopped long before the end


def train_sh(out: Path, steps: int = LONG) -> list[str]:
    return [
        "bash",
        "scripts/train.sh",
        *TINY,
        "--job.out_dir",
        str(out),
        "--train.steps",
        str(steps),
        "--checkpoint.interval",
        "100",
    ]


def launch(out: Path, steps: int = LONG) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.launch",
        "--nodes",
        "2",
        "--",
        *TINY,
        "--job.out_dir",
        str(out),
        "--train.steps",
        str(steps),
        "--checkpoint.interval",
        "100",
    ]


def _default_sigint() -> None:
    # A terminal's foreground job starts with SIGINT at its default action. Under a runner started in the
    # background (`cmd &` in a script) it would inherit "ignored", which bash cannot undo: the run's bash would
    # then never die of the second Ctrl-C, whatever the launcher does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    """Run in a new session (its own process group, like a terminal's foreground job); output to ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**ENV, **env},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )


def records(out: Path, event: str) -> list[dict]:
    p = out / "metrics.jsonl"
    rs = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
    return [r for r in rs if r["event"] == event]


def wait_for(pred, what: str, timeout: float = 120, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} while waiting for {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.1)
    return v


def stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) from /proc, None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    s = stat(pid)
    return s is not None and s[0] not in "ZX"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and (s := stat(int(d))) and s[1] == pid]


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def workers(out: Path) -> list[int]:
    """Live training workers (named t5f-rank-N) under the processes whose command line names ``out``: a cold
    worker's own command line does, a warm one's forkserver's does not, its agent's does."""
    roots = [int(d) for d in os.listdir("/proc") if d.isdigit() and str(out) in cmdline(int(d))]
    return sorted({w for r in roots for w in [r, *descendants(r)] if alive(w) and worker_rank(w) is not None})


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after ``seconds`` (empty as soon as all are gone)."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_all(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("entry", ["make train", "python -m training.launch"])
def test_ctrl_c_stops_at_a_checkpoint_and_rerun_recomputes_nothing(tmp_path, entry):
    out, log = tmp_path / "run", tmp_path / "first.log"
    argv = train_sh if entry == "make train" else launch
    p = start(argv(out), log)
    try:
        wait_for(lambda: len(records(out, "step")) >= 3, "step 3", proc=p, log=log)
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=120)
    finally:
        kill_all([p.pid, *descendants(p.pid)])
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text, text
    last = records(out, "step")[-1]["step"]
    assert [(r["signal"], r["step"]) for r in records(out, "signal")] == [("SIGINT", last)]
    assert parse_step(latest_complete(out / "checkpoints")) == last
    if entry == "make train":
        assert (
            f"[train] stopped; the newest complete checkpoint is step {last} " in text
            and "a rerun resumes there" in text
            and "run 'make train' again" not in text
        ), text[-3000:]
    else:
        assert "[launch] stopped by SIGINT" in text
    rerun = subprocess.run(argv(out, steps=last + 2), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert records(out, "start")[-1]["resumed_from"] == last  # 0 steps recomputed


def forkserver_of(pid: int) -> int | None:
    """The warm-worker forkserver among ``pid``'s descendants (it imports torch for seconds after it starts)."""
    return next((d for d in descendants(pid) if "multiprocessing.forkserver" in cmdline(d)), None)


def test_ctrl_c_before_the_first_step_says_nothing_was_saved_without_a_traceback(tmp_path):
    """Issue 29: a Ctrl-C in the first seconds printed a KeyboardInterrupt traceback from the forkserver's
    imports, then '[train] stopped at a checkpoint' although none existed."""
    out, log = tmp_path / "run", tmp_path / "run.log"
    p = start(train_sh(out), log)
    try:
        wait_for(lambda: forkserver_of(p.pid), "the forkserver", proc=p, log=log)
        os.killpg(p.pid, signal.SIGINT)  # while it imports torch and the model
        rc = p.wait(timeout=120)
    finally:
        kill_all([p.pid, *descendants(p.pid)])
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert f"[train] stopped before any checkpoint was saved ({out / 'checkpoints'} holds none)" in text, text
    assert not records(out, "step")


def test_ctrl_c_of_simulated_nodes_before_the_first_step_says_nothing_was_saved(tmp_path):
    """make train NODES=2 ended with the launcher's "run the same command again to resume" only, so make's line,
    which points at the [train] line above for where a rerun resumes (scripts/train_exit.sh), had none."""
    out, log = tmp_path / "run", tmp_path / "run.log"
    p = start(train_sh(out), log, NODES="2", NPROC="1")
    try:
        wait_for(lambda: forkserver_of(p.pid), "a forkserver", proc=p, log=log)
        os.killpg(p.pid, signal.SIGINT)  # while the workers import torch and the model
        rc = p.wait(timeout=120)
    finally:
        kill_all([p.pid, *descendants(p.pid)])
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert f"[train] stopped before any checkpoint was saved ({out / 'checkpoints'} holds none)" in text, text
    assert not records(out, "step")


def test_second_ctrl_c_stops_everything_at_once(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # The first Ctrl-C's checkpoint hangs before its commit, so the second one always lands while the clean stop
    # is still under way (a tiny model's stop can otherwise finish first: the agent then exits 130 on its own).
    p = start([*train_sh(out), "--fault.slow_commit_s", "120"], log)
    try:
        wait_for(lambda: len(records(out, "step")) >= 2, "step 2", proc=p, log=log)
        ws = workers(out)
        assert len(ws) == 2
        os.killpg(p.pid, signal.SIGINT)
        # torch logs "Sending process P closing signal SIGINT" (cold workers) or "Closing process P via signal SIGINT"
        wait_for(
            lambda: re.search(r"(closing|via) signal SIGINT", log.read_text()),
            "the agent passing SIGINT on",
            timeout=30,
        )
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=30) == -signal.SIGINT  # died by SIGINT, so a calling shell or make stops too
        assert gone_within(ws, 5) == [], log.read_text()
        assert time.monotonic() - t0 < 10
    finally:
        kill_all([p.pid, *descendants(p.pid), *workers(out)])
    text = log.read_text()
    assert "second SIGINT: stopping at once" in text and "Traceback" not in text, text
    assert latest_complete(out / "checkpoints") is None  # the interrupted stop's checkpoint never counts


def test_sigkill_of_the_torchrun_agent_kills_its_workers(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    p = start(train_sh(out), log)  # bash -> agent -> 2 workers
    try:
        wait_for(lambda: len(records(out, "step")) >= 2, "step 2", proc=p, log=log)
        (agent,) = children(p.pid)
        ws = workers(out)
        assert len(ws) == 2 and set(ws) <= set(descendants(agent)), (agent, ws, cmdline(agent))
        os.kill(agent, signal.SIGKILL)
        left = gone_within(ws, 5)
        assert left == [], f"workers {left} outlived their SIGKILLed agent {agent}"
        assert p.wait(timeout=30) == 137
    finally:
        kill_all([p.pid, *descendants(p.pid), *workers(out)])


def test_sigkill_of_the_local_launcher_stops_agents_workers_and_store(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    p = start(launch(out), log)  # launcher -> store + 2 agents -> 1 worker each
    tree: list[int] = []
    try:
        wait_for(lambda: len(records(out, "step")) >= 2, "step 2", proc=p, log=log)
        tree = descendants(p.pid)
        members = [q for q in tree if "etcdbin/etcd" in cmdline(q)]  # the membership store: 3 etcd members
        assert len(members) == 3 and len(workers(out)) == 2, [cmdline(q) for q in tree]
        os.kill(p.pid, signal.SIGKILL)
        # the agents get SIGTERM: their workers checkpoint at the next step and exit, then the agents
        left = gone_within(tree, 60)
        assert left == [], [cmdline(q) for q in left]
    finally:
        kill_all([*tree, *workers(out)])
    stops = records(out, "checkpoint")  # interval 100: the only checkpoint is the one taken on SIGTERM
    assert stops and parse_step(latest_complete(out / "checkpoints")) == stops[-1]["step"]


def test_one_run_per_checkpoint_dir(tmp_path):
    out, log = tmp_path / "run", tmp_path / "first.log"
    # It must outlive the checks below (the last one starts 2 workers: ~20 s, more under load; 300 plain tiny
    # steps once finished first in CI): it holds after each step while the hold file exists (fault.* is not part
    # of the run's identity: the later resumes match), and is let go once the checks are done. A fixed 0.4 s per
    # step for 200 steps did the same and kept the test at ~125 s whatever the checks took.
    steps, hold = 30, tmp_path / "hold"
    hold.touch()
    first = start([*train_sh(out, steps), "--fault.hold_file", str(hold)], log)
    try:
        wait_for(lambda: records(out, "step"), "the first run's step 1", proc=first, log=log)
        holder = json.loads((out / "checkpoints" / ".t5-failover.lock").read_text())
        assert holder["pid"] in workers(out)
        busy = f"in use by another run (host {holder['host']}, pid {holder['pid']}"
        # the local launcher checks before starting anything
        t0 = time.monotonic()
        r = subprocess.run(launch(out, steps), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
        assert r.returncode == 7, r.stdout + r.stderr
        assert time.monotonic() - t0 < 30
        msg = r.stderr.strip()
        assert msg.startswith("error: checkpoint.dir") and busy in msg and "another --checkpoint.dir" in msg, msg
        # make train (torchrun --standalone through the agent wrapper) checks too
        r = subprocess.run(train_sh(out, steps), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
        assert r.returncode == 7 and busy in r.stderr, r.stdout + r.stderr
        # plain torchrun has no check: the workers themselves refuse (rank 0 decides and broadcasts, all exit 7)
        r = subprocess.run(
            [
                TORCHRUN,
                "--standalone",
                "--nproc_per_node=2",
                "-m",
                "training",
                *TINY,
                "--job.out_dir",
                str(out),
                "--train.steps",
                str(steps),
            ],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode != 0 and "exitcode: 7" in r.stderr, r.stdout + r.stderr
        assert r.stderr.count(busy) == 1, r.stderr  # rank 0 speaks for the job; the others agree silently
        assert first.poll() is None, "the first run ended before the checks: it was not held"
        hold.unlink()
        assert first.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        kill_all([first.pid, *descendants(first.pid)])
    assert [r["step"] for r in records(out, "step")] == list(range(1, steps + 1))  # the first run, unaffected
    assert len(records(out, "start")) == 1
    # a run killed with SIGKILL does not leave the directory locked
    crashed = start(train_sh(out, steps + 100), tmp_path / "crashed.log")
    try:
        wait_for(
            lambda: len(records(out, "step")) > steps,
            "the second run's first step",
            proc=crashed,
            log=tmp_path / "crashed.log",
        )
        (agent,) = children(crashed.pid)
        os.kill(agent, signal.SIGKILL)
        crashed.wait(timeout=30)
    finally:
        kill_all([crashed.pid, *descendants(crashed.pid)])
    r = subprocess.run(train_sh(out, steps + 1), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert records(out, "start")[-1]["resumed_from"] == steps

"""Goodput soak: its settings, its seeded schedule and its sizing (the soak itself is a long run, measured by
``make chaos-test SOAK=10m``, not a test)."""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from chaos.local.config import REPO
from chaos.local.soak import (SOAK_FAULTS, SoakConfig, SoakConfigError, parse_duration, schedule,
                              seconds_per_step, soak_steps)


@pytest.mark.parametrize("text,seconds", [("10m", 600), ("90s", 90), ("1h", 3600), ("150", 150), ("2.5m", 150)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("cfg,words", [
    (SoakConfig(duration_s=600, every_s=10), "--soak-every 10"),
    (SoakConfig(duration_s=90), "shorter than two fault periods"),
    (SoakConfig(duration_s=600, faults=("worker-kill", "meteor")), "meteor"),
    (SoakConfig(duration_s=600, spares=0), "need a hot spare"),
    (SoakConfig(duration_s=600, spares=0, faults=("worker-kill", "straggler")), "need a hot spare"),
])
def test_bad_soak_settings_name_the_value(cfg, words):
    with pytest.raises(SoakConfigError, match=words):
        cfg.validate()
    SoakConfig(duration_s=600, spares=0, faults=("worker-kill", "hang")).validate()  # no node fault: no spare needed


def test_schedule_is_seeded_one_fault_per_period_in_its_middle_half():
    cfg = SoakConfig(duration_s=600, seed=7)
    plan = schedule(cfg, 10)
    assert plan == schedule(cfg, 10) and plan[:4] == schedule(cfg, 4)  # drawn in order, reproducible
    assert plan != schedule(SoakConfig(duration_s=600, seed=8), 10)
    for i, p in enumerate(plan):
        assert i * 60 + 15 <= p.at_s <= i * 60 + 45 and p.kind in SOAK_FAULTS
    assert len({p.kind for p in schedule(cfg, 40)}) == len(SOAK_FAULTS)  # every kind comes up


def test_job_is_sized_by_the_uninterrupted_step_time():
    recs = [{"event": "start", "time": 0.0}] + [{"event": "step", "step": n, "time": 5.0 + 0.5 * n}
                                                 for n in range(1, 10)]
    assert seconds_per_step(recs) == 0.5  # from the first step on: start-up is not a step
    assert soak_steps(0.5, 600, 4) == 1200 and soak_steps(0.5, 2, 4) == 12


def test_cli_refuses_a_bad_duration_before_running_anything():
    out = subprocess.run([sys.executable, "-m", "chaos.local", "--soak", "ten minutes"], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 2 and "SOAK='ten minutes' is not a duration" in out.stderr


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    """DRY_RUN=1 with SOAK: the settings, the seeded schedule and an agent's command; no run directory, no process
    (it used to run the real soak)."""
    env = {**os.environ, "SOAK": "10m", "DRY_RUN": "1"}
    out = subprocess.run(["make", "-s", "chaos-test", f"ARGS=--out {tmp_path / 'out'} --cache {tmp_path / 'cache'}"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fault schedule" in out.stdout and "training.launch.agent" in out.stdout
    assert "--straggler.evict_window_s 30" in out.stdout  # a straggler may be taken out once per half period
    first = schedule(SoakConfig(duration_s=600), 1)[0]  # the seeded schedule the soak would follow
    assert ["1", f"+{first.at_s:.1f}", "s", first.kind] in [line.split() for line in out.stdout.splitlines()]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def _marked(mark: str) -> list[str]:
    """Live processes (zombies aside) whose environment carries ``mark``: the harness and all it started."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X") and mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:150]!r}")
        except (OSError, IndexError):
            pass
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_soak_leaves_no_process_behind(tmp_path, stop):
    """Stopped right after it started its store and agents (Ctrl-C to its process group as a terminal sends it,
    `timeout`'s SIGTERM, or SIGKILL), the soak leaves nothing running: it used to leave its membership store (and
    agents) behind. Every process it starts inherits a marker in its environment, which is how survivors are found."""
    mark = f"T5_TEST_SOAK_MARK={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "SOAK", "NODES", "NPROC")}
    env.update(OMP_NUM_THREADS="1", T5_TEST_SOAK_MARK=mark.split("=", 1)[1])
    proc = subprocess.Popen([sys.executable, "-m", "chaos.local", "--soak", "2m", "--out", str(tmp_path / "out"),
                             "--cache", str(tmp_path / "cache")], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        seen = []
        for line in proc.stdout:  # the reference run: store first, then one agent per node
            seen.append(line)
            if "start node1: agent pid" in line:
                break
        assert any("store: etcd members pids" in s or "store: rendezvous store pid" in s for s in seen), \
            "".join(seen) + proc.stderr.read()
        os.killpg(proc.pid, stop)
        _, err = proc.communicate(timeout=120)
        if stop != signal.SIGKILL:  # one line and 128+signal; every process stopped before it exits
            assert proc.returncode == 128 + stop, err
            assert err.strip() == f"[chaos] stopped by {stop.name}: the processes it started are stopped " \
                                  f"(exit {128 + stop})", err
            assert _marked(mark) == []
        deadline = time.monotonic() + 90  # SIGKILL: the kernel's parent-death signal stops store and agents
        while (left := _marked(mark)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

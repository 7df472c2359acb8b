"""Goodput soak: its settings, its seeded schedule and its sizing (the soak itself is a long run, measured by
``make chaos-test SOAK=10m``, not a test)."""

import os
import subprocess
import sys


from chaos.local.config import REPO
from chaos.local.soak import SoakConfig, schedule


def test_cli_refuses_a_bad_duration_before_running_anything():
    out = subprocess.run(
        [sys.executable, "-m", "chaos.local", "--soak", "ten minutes"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 2 and "SOAK='ten minutes' is not a duration" in out.stderr


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    """DRY_RUN=1 with SOAK: the settings, the seeded schedule and an agent's command; no run directory, no process
    (it used to run the real soak)."""
    env = {**os.environ, "SOAK": "10m", "DRY_RUN": "1"}
    out = subprocess.run(
        ["make", "-s", "chaos-test", f"ARGS=--out {tmp_path / 'out'} --cache {tmp_path / 'cache'}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "fault schedule" in out.stdout and "training.launch.agent" in out.stdout
    assert "--straggler.evict_window_s 30" in out.stdout  # a straggler may be taken out once per half period
    first = schedule(SoakConfig(duration_s=600), 1)[0]  # the seeded schedule the soak would follow
    assert ["1", f"+{first.at_s:.1f}", "s", first.kind] in [line.split() for line in out.stdout.splitlines()]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()

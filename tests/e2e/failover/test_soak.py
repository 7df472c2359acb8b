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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chaos.local",
            "--soak",
            "2m",
            "--out",
            str(tmp_path / "out"),
            "--cache",
            str(tmp_path / "cache"),
        ],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # as from a terminal
    try:
        seen = []
        for line in proc.stdout:  # the reference run: store first, then one agent per node
            seen.append(line)
            if "start node1: agent pid" in line:
                break
        assert any("store: etcd members pids" in s or "store: rendezvous store pid" in s for s in seen), (
            "".join(seen) + proc.stderr.read()
        )
        os.killpg(proc.pid, stop)
        _, err = proc.communicate(timeout=120)
        if stop != signal.SIGKILL:  # one line and 128+signal; every process stopped before it exits
            assert proc.returncode == 128 + stop, err
            assert (
                err.strip() == f"[chaos] stopped by {stop.name}: the processes it started are stopped "
                f"(exit {128 + stop})"
            ), err
            assert _marked(mark) == []
        deadline = time.monotonic() + 90  # SIGKILL: the kernel's parent-death signal stops store and agents
        while (left := _marked(mark)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

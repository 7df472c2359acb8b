"""RunLock: one run per checkpoint directory, held by real processes, released by their death."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from training.checkpoint.run_lock import LOCK_NAME, CheckpointDirBusy, RunLock

HOLD = textwrap.dedent("""
    import os, sys, time
    from training.checkpoint.run_lock import RunLock
    lock = RunLock(sys.argv[1], run=sys.argv[2])
    assert lock.acquire()
    if sys.argv[3] == "fork":  # a forked child (like a data-loader worker) outlives the holder
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    print("held", flush=True)
    time.sleep(120)
""")


def hold(directory: Path, run: str = "other", fork: bool = False) -> subprocess.Popen:
    """A real process holding the lock on ``directory`` (returns once it holds it)."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), run, "fork" if fork else "-"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "held"
    return p


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


def test_a_held_directory_is_refused_naming_the_holder_and_the_fix(tmp_path):
    p = hold(tmp_path)
    try:
        with pytest.raises(CheckpointDirBusy) as e:
            RunLock(tmp_path).acquire()
        msg = str(e.value)
        assert str(tmp_path) in msg and f"host {socket.gethostname()}, pid {p.pid}" in msg
        assert "stop that run" in msg and "--checkpoint.dir" in msg
        with pytest.raises(CheckpointDirBusy, match=f"pid {p.pid}"):
            RunLock(tmp_path).check()
    finally:
        kill_group(p)


def test_sigkill_of_the_holder_releases_the_lock(tmp_path):
    p = hold(tmp_path)
    kill_group(p)
    lock = RunLock(tmp_path)
    assert lock.acquire()
    try:
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_NAME).read_text()
    finally:
        lock.release()


def test_a_forked_child_does_not_keep_the_lock_after_the_holder_died(tmp_path):
    p = hold(tmp_path, fork=True)
    child = [int(c) for c in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    assert len(child) == 1
    os.kill(p.pid, signal.SIGKILL)  # the holder only: its forked child keeps running
    p.wait(timeout=10)
    try:
        os.kill(child[0], 0)  # still alive
        lock = RunLock(tmp_path)
        assert lock.acquire()
        lock.release()
    finally:
        os.kill(child[0], signal.SIGKILL)


def test_a_previous_incarnation_of_the_same_run_is_waited_for_another_run_is_not(tmp_path):
    p = hold(tmp_path, run="job-1")
    try:
        t0 = time.monotonic()
        with pytest.raises(CheckpointDirBusy, match="run job-1"):
            RunLock(tmp_path, run="job-2").acquire(wait_same_run_s=30)
        assert time.monotonic() - t0 < 5
        subprocess.Popen(["sh", "-c", f"sleep 1; kill -9 {p.pid}"])
        t0 = time.monotonic()
        lock = RunLock(tmp_path, run="job-1")
        assert lock.acquire(wait_same_run_s=30)
        assert 0.5 < time.monotonic() - t0 < 20
        lock.release()
    finally:
        kill_group(p)


def test_release_frees_it_and_check_creates_nothing(tmp_path):
    RunLock(tmp_path / "none").check()  # no lock file: nobody holds it
    assert not (tmp_path / "none").exists()
    a = RunLock(tmp_path / "ckpt")
    assert a.acquire() and a.held
    a.release()
    a.release()  # idempotent
    RunLock(tmp_path / "ckpt").check()
    with RunLock(tmp_path / "ckpt"):
        pass


def test_file_system_without_flock_warns_once_and_continues(tmp_path, caplog, monkeypatch):
    """No file system without flock can be mounted here, so the kernel's answer on one (ENOLCK from a Lustre
    client mounted without -o flock, or NFS) is reproduced at the fcntl call; everything else is real."""
    import errno
    import fcntl

    import training.checkpoint.run_lock as run_lock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(run_lock, "_warned_unsupported", False)
    d = tmp_path / "nolock"
    with caplog.at_level("WARNING", logger="training"):
        assert RunLock(d).acquire() is False
        assert RunLock(d).acquire() is False
    assert sum("does not support flock" in r.message for r in caplog.records) == 1

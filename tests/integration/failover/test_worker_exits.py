"""The in-place agent's wake-up on a worker's end (training/launch/worker_exits.py), with real processes: a pidfd
wakes the wait when one of them ends (not when the timeout runs out), a process seen ended is not reported again,
the pidfds of processes no longer asked about are closed, and another thread's wake ends a wait (the agent's watch
of the board's gone/ reports: tests/integration/failover/test_inplace_agent.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from training.launch.worker_exits import WorkerExits

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds (os.pidfd_open)")


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_wait_ends_when_a_worker_ends_and_names_it():
    alive, victim = _sleeper(), _sleeper()
    exits = WorkerExits()
    try:
        assert exits.wait([alive.pid, victim.pid], 0.2) == set()  # nothing ended: the timeout
        threading.Timer(0.3, victim.send_signal, (signal.SIGKILL,)).start()
        # a 60 s timeout: only the end of the killed process can return it with its pid (not reaped: a zombie)
        assert exits.wait([alive.pid, victim.pid], 60) == {victim.pid}
        # seen ended and not collected yet: not reported again, while the other is still waited on
        assert exits.wait([alive.pid, victim.pid], 0.2) == set()
        victim.wait()
        alive.kill()
        assert exits.wait([alive.pid], 60) == {alive.pid}
    finally:
        exits.close()
        for p in (alive, victim):
            p.kill()
            p.wait()


def test_a_process_gone_before_the_wait_is_named_at_once():
    gone = _sleeper()
    gone.kill()
    gone.wait()  # reaped: no pid to open any more
    exits = WorkerExits()
    try:
        assert exits.wait([gone.pid], 60) == {gone.pid}
    finally:
        exits.close()


def test_pidfds_of_processes_no_longer_asked_about_are_closed():
    a, b = _sleeper(), _sleeper()
    exits = WorkerExits()
    try:
        before = _open_fds()
        exits.wait([a.pid, b.pid], 0.01)
        assert _open_fds() == before + 2
        exits.wait([a.pid], 0.01)
        assert _open_fds() == before + 1
        exits.close()
        assert _open_fds() == before
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_without_pidfds_it_sleeps_the_interval_as_torch_does(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")  # Python on a platform without them
    p = _sleeper()
    exits = WorkerExits()
    try:
        p.kill()
        p.wait()
        assert exits.wait([p.pid], 0.05) == set()  # not seen: the agent's next look collects it
    finally:
        exits.close()


def test_a_wake_from_another_thread_ends_the_wait_without_naming_any_process():
    alive = _sleeper()
    exits = WorkerExits()
    try:
        threading.Timer(0.2, exits.wake).start()
        assert exits.wait([alive.pid], 60) == set()  # woken: a 60 s wait could not end otherwise within the test
        exits.wake()
        exits.wake()  # wakes that came while nothing waited end the next wait only
        assert exits.wait([alive.pid], 60) == set()
        assert exits.wait([alive.pid], 0.05) == set()
    finally:
        exits.close()
        alive.kill()
        alive.wait()

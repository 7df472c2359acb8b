"""training.job.lifecycle: real parent and child processes, real SIGKILL of the parent (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

# A parent that starts a child from its main thread (or from a thread that ends once the child is armed), prints
# the child's pid, then sleeps. The child asks to die with it (SIGTERM) and sleeps.
PARENT = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    child = [sys.executable, "-c",
             "import os, signal, time; from training.job.lifecycle import die_with_launcher; "
             "assert die_with_launcher(signal.SIGTERM); assert 'T5_DIE_WITH_PARENT' not in os.environ; "
             "print('armed', flush=True); time.sleep(120)"]
    env = dict(os.environ, T5_DIE_WITH_PARENT=str(os.getpid()))
    procs = []
    def start():
        procs.append(subprocess.Popen(child, env=env, stdout=subprocess.PIPE, text=True))
        assert procs[0].stdout.readline().strip() == "armed"
    if sys.argv[1] == "thread":
        t = threading.Thread(target=start); t.start(); t.join()
    else:
        start()
    print(procs[0].pid, flush=True)
    time.sleep(120)
""")


def parent(how: str) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen(
        [sys.executable, "-c", PARENT, how], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return p, int(p.stdout.readline())


def exit_state(pid: int, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return "gone"
        except OSError:
            return "gone"
        time.sleep(0.05)
    return "alive"


def test_child_gets_its_signal_when_the_parent_is_sigkilled():
    p, child = parent("main")
    try:
        assert exit_state(child, 0.5) == "alive"
        os.kill(p.pid, signal.SIGKILL)
        assert exit_state(child) == "gone"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_the_signal_follows_the_forking_thread_so_parents_fork_from_their_main_thread():
    """Why every parent here starts its children from the main thread: the kernel ties the parent-death signal
    to the thread that forked, and a child started from a thread that then ends is signalled at that moment."""
    p, child = parent("thread")
    try:
        assert exit_state(child) == "gone"  # the starting thread ended; the parent process still runs
        assert p.poll() is None
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_parent_already_gone_means_the_signal_is_sent_at_once():
    # The child names a parent that is not its parent (as if the real one died before the request).
    code = (
        "import signal, time; from training.job.lifecycle import die_with_parent; "
        "die_with_parent(signal.SIGTERM, parent_pid=1 if __import__('os').getppid() != 1 else 2); time.sleep(30)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=30)
    assert r.returncode == -signal.SIGTERM


def test_a_worker_outside_torchrun_arms_nothing():
    code = "from training.job.lifecycle import die_with_agent; print(die_with_agent())"
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "False", r.stderr


def test_a_worker_whose_agent_died_before_it_started_kills_itself():
    code = "from training.job.lifecycle import die_with_agent; die_with_agent(); print('still running')"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    env = dict(os.environ, TORCHELASTIC_RUN_ID="x", T5_AGENT_PID=str(dead.pid))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == -signal.SIGKILL and "still running" not in r.stdout


def test_a_worker_names_itself_by_rank_and_tools_read_it_back():
    import subprocess
    import sys
    import time

    from training.job.lifecycle import worker_rank

    code = (
        "from training.job.lifecycle import name_worker; import sys, time; name_worker(12); "
        "print('ok', flush=True); time.sleep(30)"
    )
    named = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen(["sleep", "30"])
    try:
        assert named.stdout.readline().strip() == "ok"
        assert worker_rank(named.pid) == 12 and open(f"/proc/{named.pid}/comm").read().strip() == "t5f-rank-12"
        assert worker_rank(plain.pid) is None
    finally:
        for p in (named, plain):
            p.kill()
            p.wait()
    time.sleep(0.1)
    assert worker_rank(named.pid) is None  # gone


def test_exit_without_finalization_keeps_the_output_and_the_code_and_skips_finalizers():
    # Buffered output (a pipe, not a terminal) and log records reach the parent; atexit handlers, which are part of
    # the finalization this exit skips, do not run.
    code = (
        "import atexit, logging, sys; from training.job.lifecycle import exit_without_finalization; "
        "logging.basicConfig(stream=sys.stderr); atexit.register(lambda: print('finalized')); "
        "print('done', end=''); logging.getLogger('x').warning('logged'); exit_without_finalization(3)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (3, "done")
    assert "logged" in r.stderr

"""tests/unit/conftest.py's guard, run on probe tests placed in the unit tier: a socket used by the test or by a
thread it starts fails the test; a test that uses none passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

from tests.conftest import ROOT

PROBE = """
import socket
import threading
import time

def knock():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=0.2).close()
    except OSError:
        pass

def test_without_a_socket():
    time.sleep(0.1)

def test_a_socket_of_the_test_fails_it():
    knock()

def test_a_socket_of_a_thread_the_test_starts_fails_it():
    t = threading.Thread(target=knock)
    t.start()
    t.join()
"""


def test_the_guard_fails_a_unit_test_whose_code_or_thread_uses_a_socket():
    probe = ROOT / "tests" / "unit" / f"_probe_{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        (probe / "test_probe.py").write_text(PROBE)
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", "-rA", str(probe)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(probe)
    out = r.stdout + r.stderr
    assert "PASSED" in out and "::test_without_a_socket" in out, out
    for name in ("test_a_socket_of_the_test_fails_it", "test_a_socket_of_a_thread_the_test_starts_fails_it"):
        assert f"FAILED tests/unit/{probe.name}/test_probe.py::{name}" in out, out
    assert "a unit-tier test must not start a process or use a socket" in out, out
    assert "1 passed" in out and "2 failed" in out, out

"""tests/support/session_once.py: what the suite's workers share is made once, by whichever asks first, and a failed
attempt is made again rather than reused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.session_once import DONE, made_once, session_root


def test_the_second_caller_reuses_what_the_first_made(tmp_path):
    calls = []

    def make(out: Path) -> None:
        calls.append(out)
        (out / "weights").write_text("w")

    first = made_once(tmp_path, "ref", make)
    second = made_once(tmp_path, "ref", make)
    assert first == second == tmp_path / "ref" and len(calls) == 1
    assert (second / "weights").read_text() == "w" and (second / DONE).exists()


def test_a_failed_attempt_is_made_again_from_scratch(tmp_path):
    def fails(out: Path) -> None:
        (out / "half").write_text("")
        raise RuntimeError("the reference run failed")

    with pytest.raises(RuntimeError):
        made_once(tmp_path, "ref", fails)
    out = made_once(tmp_path, "ref", lambda out: (out / "weights").write_text("w"))
    assert sorted(p.name for p in out.iterdir()) == [DONE, "weights"]  # nothing of the failed attempt


def test_a_caller_waits_for_the_one_making_it(tmp_path):
    """Two callers at once (two workers): the second blocks on the lock while the first makes it, then reuses it."""
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(out: Path) -> None:
        calls.append("slow")
        started.set()
        release.wait(10)
        (out / "weights").write_text("w")

    first = threading.Thread(target=made_once, args=(tmp_path, "ref", slow))
    first.start()
    assert started.wait(10)
    got = []
    second = threading.Thread(target=lambda: got.append(made_once(tmp_path, "ref", lambda out: calls.append("2nd"))))
    second.start()
    second.join(0.3)
    assert second.is_alive() and got == []  # waiting on the first one's lock, not making its own
    release.set()
    first.join(10)
    second.join(10)
    assert calls == ["slow"] and (got[0] / "weights").read_text() == "w"


def test_the_root_is_this_sessions_own(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert session_root(tmp_path_factory) == base.parent  # pytest-N: every worker's basetemp is under it
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert session_root(tmp_path_factory) == base  # one process: never /tmp/pytest-of-USER, shared by sessions

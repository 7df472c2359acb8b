"""Something expensive a test session makes once for all its pytest-xdist workers (e.g. an uninterrupted reference
run that files on several workers compare against).

A session fixture is built once per worker, so with 3 workers a reference run that files on every worker use ran 3
times. :func:`made_once` builds it once in the session's shared temporary root, under an exclusive file lock: the
first worker to ask makes it, the others wait on the lock and reuse it. Only a finished build counts (its DONE
marker): a worker that failed half-way leaves nothing another would take for the result. The root is the session's
own (under xdist the parent of this worker's basetemp, pytest-N; without xdist the basetemp itself), so nothing is
reused across sessions, where the code may have changed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = "DONE"


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every worker of this session shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(root: Path, name: str, make: Callable[[Path], None]) -> Path:
    """``root/name``, filled by ``make(path)`` the first time any process asks for ``name`` in ``root`` (the
    session's: :func:`session_root`)."""
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not (out / DONE).exists():
            shutil.rmtree(out, ignore_errors=True)  # a failed attempt's leftovers
            out.mkdir()
            make(out)
            (out / DONE).write_text("")
    return out

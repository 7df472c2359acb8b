"""The launcher's work directories (training/launch/workdir.py): the ones whose launcher is gone (killed, so it could
not remove its own) are removed at the next launcher's start, with one line; a running launcher's are kept, and so
is an unnamed one that is recent. Real processes stand for the launchers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from training.launch.workdir import OWNER_FILE, PREFIX, UNNAMED_AFTER_S, _start_ticks, make_workdir


def _workdir(root: Path, name: str, owner: str | None, size: int = 0) -> Path:
    d = root / f"{PREFIX}{name}"
    (d / "etcd").mkdir(parents=True)
    (d / "etcd" / "wal").write_bytes(b"x" * size)
    if owner is not None:
        (d / OWNER_FILE).write_text(owner)
    return d


def _ended_process() -> tuple[int, str]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ticks = _start_ticks(p.pid)
    p.kill()
    p.wait()
    return p.pid, ticks


def test_a_killed_launchers_directory_is_removed_at_the_next_start_and_a_running_ones_kept(tmp_path):
    pid, ticks = _ended_process()
    killed = _workdir(tmp_path, "killed", f"{pid} {ticks}\n", size=3 << 20)
    running = _workdir(tmp_path, "running", f"{os.getpid()} {_start_ticks(os.getpid())}\n")
    reused = _workdir(tmp_path, "reused", f"{os.getpid()} 1\n")  # this pid, another process's start time
    fresh_unnamed = _workdir(tmp_path, "fresh", None)
    old_unnamed = _workdir(tmp_path, "old", None)
    old = time.time() - UNNAMED_AFTER_S - 60
    os.utime(old_unnamed, (old, old))
    unrelated = tmp_path / "t5-other-dir"
    unrelated.mkdir()
    lines: list[str] = []
    mine = Path(make_workdir(str(tmp_path), say=lines.append))
    assert not killed.exists() and not reused.exists() and not old_unnamed.exists()
    assert running.exists() and fresh_unnamed.exists() and unrelated.exists()
    assert mine.is_dir() and mine.name.startswith(PREFIX)
    assert (mine / OWNER_FILE).read_text().split() == [str(os.getpid()), _start_ticks(os.getpid())]
    (line,) = lines
    assert line.startswith("[launch] removed 3 work directories of launchers no longer running (3 MiB in ")
    lines.clear()
    make_workdir(str(tmp_path), say=lines.append)
    assert lines == [] and mine.exists()  # this process still runs: its directory is not an orphan

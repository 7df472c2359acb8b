"""The local launcher's work directory, and the ones launchers that were killed left behind.

``python -m training.launch`` keeps its etcd's data and certificates (or its store's port file) in a directory of
its own under the temp dir, ``t5-launch-*``, removed when it returns. A launcher that is SIGKILLed (a test's
timeout, the OOM killer, ``kill -9``) cannot remove it: ~180 MB each (etcd's preallocated WAL), piling up in
``/tmp``. So each directory names its launcher (``launcher``: its pid and the kernel's start time of that process,
so a reused pid is not mistaken for it), and every launcher's start removes the directories whose launcher is no
longer running, in one line::

    workdir = make_workdir()        # removes the orphans first
    ...
    shutil.rmtree(workdir, ignore_errors=True)

A directory without its ``launcher`` file is left alone unless it is older than ``UNNAMED_AFTER_S`` (one made by a
launcher that has not named itself yet, or by a version before this one).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from training.job.lifecycle import proc_stat, process_running

#: The prefix of a launcher's work directory under the temp dir.
PREFIX = "t5-launch-"
#: The file in it that names its launcher: "<pid> <start time in clock ticks>".
OWNER_FILE = "launcher"
#: Seconds after which a work directory that names no launcher is taken for an orphan.
UNNAMED_AFTER_S = 24 * 3600.0


def _start_ticks(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/PID/stat`` field 22), None if it is not running."""
    fields = proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def make_workdir(root: str | None = None, say=print) -> str:
    """A new work directory naming this process as its launcher, after removing the orphaned ones."""
    remove_orphans(root, say=say)
    workdir = tempfile.mkdtemp(prefix=PREFIX, dir=root)
    Path(workdir, OWNER_FILE).write_text(f"{os.getpid()} {_start_ticks(os.getpid())}\n")
    return workdir


def _orphaned(path: Path, now: float) -> bool:
    try:
        pid_text, ticks = path.joinpath(OWNER_FILE).read_text().split()
    except FileNotFoundError:
        try:
            return now - path.stat().st_mtime > UNNAMED_AFTER_S
        except OSError:
            return False
    except (OSError, ValueError):
        return False  # unreadable: not ours to judge
    pid = int(pid_text) if pid_text.isdigit() else -1
    return not (pid > 0 and process_running(pid) and _start_ticks(pid) == ticks)


def _size(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:  # gone meanwhile (a member of its etcd still dying)
            pass
    return total


def remove_orphans(root: str | None = None, say=print) -> list[Path]:
    """Remove the work directories under ``root`` (the temp dir) whose launcher is not running; one line when any
    was. Returns them."""
    base, now = Path(root or tempfile.gettempdir()), time.time()
    gone, freed = [], 0
    for path in sorted(base.glob(PREFIX + "*")):
        if not path.is_dir() or path.is_symlink() or not _orphaned(path, now):
            continue
        size = _size(path)
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            gone.append(path)
            freed += size
    if gone:
        say(
            f"[launch] removed {len(gone)} work director{'y' if len(gone) == 1 else 'ies'} of launchers no longer "
            f"running ({freed / 2**20:.0f} MiB in {base}: {', '.join(p.name for p in gone[:3])}"
            f"{', ...' if len(gone) > 3 else ''})"
        )
    return gone

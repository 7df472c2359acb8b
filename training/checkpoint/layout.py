"""Where checkpoints live and how to tell ours from anything else: names, commit markers, discovery.

Torch-free, so the start checks (:mod:`training.job.check`) and the tools use the same rules as the manager
(:mod:`training.checkpoint`) without importing torch. Layout of a ``checkpoint.dir``::

    step_00000010/         DCP files of every rank, .t5-failover (ownership, written first), COMMITTED.json (last)
    quarantine/            damaged checkpoints moved aside (never deleted)
    superseded/            checkpoints newer than a chosen checkpoint.load_step (kept)
    .t5-failover-lineage   the run's id (in-memory snapshots carry it)
    .t5-failover.lock      one run at a time (training.checkpoint.run_lock)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

MARKER = "COMMITTED.json"
OWNED = ".t5-failover"
PREFIX = "step_"
QUARANTINE = "quarantine"
SUPERSEDED = "superseded"
ROLLBACK = ".t5-failover-rollback"
LOCK = ".t5-failover.lock"
PROBE = ".t5-failover-probe"
LINEAGE = ".t5-failover-lineage"
#: What every commit marker records; one without them is damaged (a resume would fail on it in every rank).
MARKER_FIELDS = ("step", "signature", "files")
OURS_AT_ROOT = {QUARANTINE, SUPERSEDED, ROLLBACK, LOCK, LINEAGE}
#: A step directory is made under this scratch name (".step_00000006.new-<pid>") with its ownership file inside,
#: then renamed into place; one of ours is removed by renaming it to ".step_00000006.old-<ns>" first, then deleting
#: that (:func:`remove_ours`). Either way a rank killed midway leaves no step directory without its ownership file
#: (which a later start would take for someone else's and refuse to overwrite: CI once saw a resume refused so,
#: after rank 0 was killed while deleting a failed save). Scratch names are ours; the next save sweeps them.
SCRATCH_RE = re.compile(rf"^\.{re.escape(PREFIX)}\d+\.(new|old)-\d+$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def remove_ours(path: Path, *, ignore_errors: bool = False) -> None:
    """Delete a step directory of ours without ever leaving it half-deleted under its own name: one rename to a
    scratch name (atomic), then the deletion. A missing ``path`` is fine; a rename that fails raises OSError
    unless ``ignore_errors`` (then the directory stays for a later attempt)."""
    trash = path.with_name(f".{path.name}.old-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    except OSError:
        if ignore_errors:
            return
        raise
    shutil.rmtree(trash, ignore_errors=True)  # what a kill leaves here is swept by the next save


def parse_step(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX) :].isdigit():
        return None
    return int(name[len(PREFIX) :])


def read_marker(path: Path) -> dict[str, Any]:
    return json.loads((path / MARKER).read_text())


def _file_sizes(info: dict[str, Any]) -> dict[str, int]:
    """{file: size} from a marker (format 1 recorded sizes only, format 2 size and crc32c)."""
    return {n: (v["size"] if isinstance(v, dict) else v) for n, v in info["files"].items()}


def is_ours(path: Path) -> bool:
    """True for a step directory this project created (ownership file, or a commit marker of ours)."""
    if (path / OWNED).is_file():
        return True
    try:
        info = read_marker(path)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and {"step", "signature", "files"} <= info.keys()


def verify(path: Path) -> tuple[bool, str]:
    """(True, "") if `path` has a valid commit marker and every file has its recorded size; else (False, why).

    Cheap (no reading of data); checksums are verified by the manager, shared over the ranks, before loading."""
    if not (path / MARKER).is_file():
        return False, "no commit marker (the save did not finish)"
    try:
        info = read_marker(path)
        missing = [k for k in MARKER_FIELDS if k not in info]
        if missing:
            return False, f"commit marker {path / MARKER} lacks {', '.join(missing)} (edited or damaged)"
        named = parse_step(path)  # a copy under another name (compare, export, initial_load_path) is fine
        if not isinstance(info["step"], int) or named is not None and info["step"] != named:
            return False, f"commit marker {path / MARKER} records step {info['step']!r}, not the directory's"
        sizes = _file_sizes(info)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return False, f"unreadable commit marker {path / MARKER} ({e})"
    for name, size in sizes.items():
        f = path / name
        if not f.is_file():
            return False, f"file {f} is missing"
        if f.stat().st_size != size:
            return False, f"file {f} has {f.stat().st_size} bytes, {size} were written (truncated or corrupt)"
    return True, ""


def scan(root: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints newest first, [(rejected dir, reason)] newest first); only our own directories."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    dirs = sorted(
        (p for p in root.iterdir() if p.is_dir() and parse_step(p) is not None and is_ours(p)),
        key=parse_step,
        reverse=True,
    )
    good, bad = [], []
    for p in dirs:
        ok, why = verify(p)
        (good.append(p) if ok else bad.append((p, why)))
    return good, bad


def foreign_entries(root: str | Path) -> list[str]:
    """Names in `root` this project did not write (never loaded, pruned or overwritten)."""
    root = Path(root)
    if not root.is_dir():
        return []

    def ours(p: Path) -> bool:
        return bool(
            p.name in OURS_AT_ROOT
            or SCRATCH_RE.match(p.name)
            or (p.is_dir() and parse_step(p) is not None and is_ours(p))
        )

    return sorted(p.name for p in root.iterdir() if not ours(p))


def latest_complete(root: str | Path) -> Path | None:
    good, _ = scan(root)
    return good[0] if good else None


def is_checkpoint_root(path: Path) -> bool:
    """True for a directory some run of this project uses as its checkpoint.dir (its lineage or lock file, or a
    step directory of ours in it)."""
    try:
        if (path / LINEAGE).is_file() or (path / LOCK).is_file():
            return True
        return any(parse_step(p) is not None and is_ours(p) for p in path.glob(f"{PREFIX}*"))
    except OSError:
        return False


#: How far below a checkpoint.dir the start looks for another run's checkpoints, and how many entries at most
#: (a checkpoint.dir pointed at the top of a shared file system must not scan it all).
NESTED_DEPTH, NESTED_ENTRIES = 4, 20_000


def nesting_problem(checkpoint_dir: str) -> str | None:
    """Why ``checkpoint_dir`` must not be used because it lies inside another run's checkpoints (that run's
    retention or quarantine would one day delete or move it, with this run's checkpoints) or holds another
    run's checkpoint.dir below it (the same, the other way round); None when it stands apart."""
    real = Path(os.path.realpath(checkpoint_dir))
    for up in (real, *real.parents):
        if parse_step(up) is not None and is_ours(up):
            where = "is" if up == real else "is inside"
            return (
                f"checkpoint.dir={checkpoint_dir!r} {where} {up.name}, a checkpoint of the run in {up.parent}: "
                "that run's retention (checkpoint.keep_last) deletes it, and everything in it, once newer "
                "checkpoints exist; point --checkpoint.dir (or --job.out_dir) at a directory of its own outside "
                f"{up.parent} (nothing was changed)"
            )
        if up != real and is_checkpoint_root(up):  # its quarantine/ and superseded/ too: their parent is one
            return (
                f"checkpoint.dir={checkpoint_dir!r} is inside {up}, the checkpoint.dir of another run: its "
                "checkpoints and this run's would be mixed up and pruned together; point --checkpoint.dir (or "
                f"--job.out_dir) at a directory of its own outside {up} (nothing was changed)"
            )
    nested = _checkpoint_root_below(real)
    if nested is not None:
        return (
            f"checkpoint.dir={checkpoint_dir!r} holds another run's checkpoint.dir {nested}: this run's "
            "retention and quarantine act on what it finds there, so one run's checkpoints would sit inside "
            "the other's; point --checkpoint.dir (or --job.out_dir) at a directory of its own (nothing was "
            "changed)"
        )
    return None


def _checkpoint_root_below(root: Path) -> Path | None:
    """The first directory below ``root`` (depth <= NESTED_DEPTH, at most NESTED_ENTRIES looked at) that another
    run uses as its checkpoint.dir; None if none was found."""
    seen, level = 0, [root]
    for _ in range(NESTED_DEPTH):
        below = []
        for d in level:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                seen += 1
                if seen > NESTED_ENTRIES:
                    return None
                if e.is_dir(follow_symlinks=False):
                    p = Path(e.path)
                    if is_checkpoint_root(p):
                        return p
                    below.append(p)
        level = below
    return None

"""Checkpoint manager: owns the save policy, commit markers, discovery, fallback and retention.

Layout: ``<dir>/step_00000010/`` holds the torch.distributed.checkpoint (DCP) files of every rank plus
``COMMITTED.json``, written by rank 0 only after every rank's data and DCP's ``.metadata`` are on disk
(for async saves: after the background write finished). The marker records each file's size, so a
truncated file is noticed before loading. "Latest" is the newest step directory with a valid marker.

Call ``save(step, state)`` after every step; the manager decides whether that step is saved.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from training.config import CheckpointConfig
from training.staging import ReusedBufferStager

log = logging.getLogger("training.checkpoint")
MARKER = "COMMITTED.json"
PREFIX = "step_"


class CheckpointIncompatible(RuntimeError):
    """The checkpoint directory holds a checkpoint of a different model; loading it would be wrong."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def parse_step(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
        return None
    return int(name[len(PREFIX):])


def verify(path: Path) -> tuple[bool, str]:
    """(True, "") if `path` is a complete checkpoint; else (False, why)."""
    marker = path / MARKER
    if not marker.is_file():
        return False, "no commit marker (the save did not finish)"
    try:
        info = json.loads(marker.read_text())
        files = info["files"]
    except (OSError, ValueError, KeyError) as e:
        return False, f"unreadable commit marker ({e})"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return False, f"file {name} is missing"
        if f.stat().st_size != size:
            return False, f"file {name} has {f.stat().st_size} bytes, {size} were written (truncated or corrupt)"
    return True, ""


def read_marker(path: Path) -> dict[str, Any]:
    return json.loads((path / MARKER).read_text())


def scan(root: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints newest first, [(rejected dir, reason)] newest first)."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    dirs = sorted((p for p in root.iterdir() if p.is_dir() and parse_step(p) is not None),
                  key=parse_step, reverse=True)
    good, bad = [], []
    for p in dirs:
        ok, why = verify(p)
        (good.append(p) if ok else bad.append((p, why)))
    return good, bad


def latest_complete(root: str | Path) -> Path | None:
    good, _ = scan(root)
    return good[0] if good else None


class CheckpointManager:
    """Saves (sync or async on its own gloo group), commits, discovers, loads with fallback, prunes."""

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, signature: dict[str, Any],
                 slow_commit_s: float = 0.0, on_commit: Callable[[int], None] | None = None):
        self.cfg = cfg
        self.root = Path(cfg.dir)
        self.rank, self.world_size = rank, world_size
        self.signature = signature
        self.slow_commit_s = slow_commit_s
        self.on_commit = on_commit or (lambda step: None)
        # Checkpoint collectives get their own gloo group: async saves run them on a background thread
        # without racing the training group, and a slow writer is not cut off by the short training timeout.
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))
        self._pending: tuple[int, Any, threading.Event] | None = None
        # Host buffers for async saves, reused by every save of the run (pinned for GPU tensors).
        self._stager = ReusedBufferStager()
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    # ---- discovery and loading -------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        """Rank 0 scans and broadcasts, so every rank tries the same checkpoints in the same order."""
        payload: list[Any] = [None]
        if self.rank == 0:
            good, bad = scan(self.root)
            newest_good = parse_step(good[0]) if good else -1
            for p, why in bad:
                if parse_step(p) > newest_good:
                    log.warning("WARNING: skipping checkpoint %s: %s; falling back to an older one", p, why)
            payload = [[str(p) for p in good]]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        return payload[0]

    def load(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into the Stateful objects in `state`.

        Returns its commit record, or None for a fresh start. Raises CheckpointIncompatible if it was
        written for another model shape. A checkpoint that fails to load is skipped with a warning.
        Keys absent from a checkpoint (per-rank RNG of ranks that did not exist) are left as they are.
        """
        for path in self._candidates():
            p = Path(path)
            info = read_marker(p)
            if info.get("signature") != self.signature:
                raise CheckpointIncompatible(
                    f"checkpoint {p} was written for model {info.get('signature')}, but this run's model is "
                    f"{self.signature}. Use the model settings it was written with, or point checkpoint.dir "
                    f"at a new directory to start fresh (nothing was loaded or overwritten)")
            try:
                stored = set(dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata)
                wanted = {k: v for k, v in state.items()
                          if any(s == k or s.startswith(k + ".") for s in stored)}
                dcp.load(wanted, checkpoint_id=str(p), process_group=self.group)
            except Exception as e:  # noqa: BLE001 - any read failure means "try the previous one"
                if self.rank == 0:
                    log.warning("WARNING: checkpoint %s could not be loaded (%s); falling back to an older one",
                                p, str(e).splitlines()[0][:300])
                continue
            info["missing_keys"] = sorted(set(state) - set(wanted))
            return info
        return None

    # ---- saving ----------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return step % self.cfg.interval == 0

    def save(self, step: int, state: dict[str, Any], *, force: bool = False, sync: bool = False) -> float:
        """Save `state` at `step` if the policy says so (or `force`). Returns the seconds training was blocked."""
        if not (force or self.due(step)):
            return 0.0
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        path = step_dir(self.root, step)
        if self.rank == 0 and path.exists():
            # A leftover of an earlier attempt at this step (crash, or a rerun after resuming earlier).
            shutil.rmtree(path)
        dist.barrier(group=self.group)
        if self.cfg.async_save and not sync:
            done = threading.Event()
            fut = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group,
                                 async_stager=self._stager)
            fut.add_done_callback(lambda f, s=step, e=done: self._on_async_done(f, s, e))
            self._pending = (step, fut, done)
        else:
            dcp.save(state, checkpoint_id=str(path), process_group=self.group)
            self._commit(step)
            # Nobody leaves before rank 0's marker is down: a sync save precedes an exit (signal, last step),
            # and a rank exiting early makes torchrun/srun tear down the others, rank 0 mid-commit included.
            dist.barrier(group=self.group)
        return time.perf_counter() - t0

    def _on_async_done(self, fut, step: int, done: threading.Event) -> None:
        try:
            fut.result()
            self._commit(step)
        except Exception as e:  # noqa: BLE001 - an uncommitted checkpoint is simply never used
            log.error("ERROR: async checkpoint of step %d failed (%s); it stays uncommitted", step, e)
        finally:
            done.set()

    def wait(self) -> None:
        """Block until the in-flight async save (if any) is written and committed."""
        if self._pending is not None:
            _, fut, done = self._pending
            fut.result()
            done.wait()
            self._pending = None

    def _commit(self, step: int) -> None:
        if self.rank != 0:
            return
        if self.slow_commit_s:
            time.sleep(self.slow_commit_s)
        path = step_dir(self.root, step)
        files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file() and f.name != MARKER}
        record = {"step": step, "world_size": self.world_size, "signature": self.signature,
                  "files": files, "time": time.time()}
        tmp = path / (MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / MARKER)  # atomic: the marker is either absent or whole
        self.on_commit(step)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest `keep_last` complete checkpoints; drop everything older than the oldest kept."""
        good, bad = scan(self.root)
        if len(good) <= self.cfg.keep_last:
            return
        oldest_kept = parse_step(good[self.cfg.keep_last - 1])
        for p in good[self.cfg.keep_last:] + [b for b, _ in bad]:
            if parse_step(p) < oldest_kept:
                shutil.rmtree(p, ignore_errors=True)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._stager.close()

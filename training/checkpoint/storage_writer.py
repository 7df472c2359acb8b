"""The storage tier's writing half: save a step (sync, or async on the checkpoint group), commit it, prune.

A step directory is created with its ownership file already inside (scratch name, one rename); rank 0 writes the
commit marker ``COMMITTED.json`` only after every rank's data and DCP's ``.metadata`` are on disk (for async saves:
after the background write finished), with each file's size and CRC32C (computed by the ranks, each its share)
and the run's fingerprint. A failed save is reported with its reason (exit 6; PeerLost when a collective lost a
peer), its directory removed and the previous complete checkpoint untouched.
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
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint import storage_choices as choose
from training.checkpoint.background import start_writes
from training.checkpoint.integrity import crc32c_file, peer_reason, share, storage_reason
from training.checkpoint.layout import (
    MARKER,
    OWNED,
    SCRATCH_RE,
    is_ours,
    latest_complete,
    parse_step,
    remove_ours,
    scan,
    step_dir,
)
from training.checkpoint.staging import ReusedBufferStager
from training.checkpoint.step_writer import StepDirWriter
from training.checkpoint.storage_site import StorageSite
from training.errors import CheckpointStorageError, PeerLost, StaleGroup

log = logging.getLogger("training.checkpoint")


class StorageWriter:
    """Saves the steps the interval makes due (or forced), one async save in flight at a time; commits and prunes.

    `before_save` runs (on every rank) right before a checkpoint is taken, e.g. a check that the state is finite;
    it may raise to prevent the save. `during_save` (once the step's directory is agreed) and `before_commit` (data
    written, marker not yet) are fault-injection points; `on_commit` hears of each committed step.
    """

    def __init__(
        self,
        site: StorageSite,
        *,
        signature: dict[str, Any],
        fingerprint: dict[str, Any],
        before_save: Callable[[int], None],
        during_save: Callable[[int], None],
        before_commit: Callable[[int], dict | None],
        on_commit: Callable[[int], None],
        stager: ReusedBufferStager | None = None,
    ):
        self.site = site
        self.cfg = site.cfg
        self.signature = signature
        self.fingerprint = fingerprint
        self.before_save, self.during_save = before_save, during_save
        self.before_commit, self.on_commit = before_commit, on_commit
        self._pending: tuple[int, Any, threading.Event] | None = None
        self._abandoned = False  # an in-place recovery let the save in flight go: it never commits nor discards
        self.failure: str | None = None  # why the last async save failed, once known
        self._failure_kind: type[Exception] = CheckpointStorageError
        self.collective_timeout_s = self.cfg.timeout_s  # lowered once a save has been timed (_bound_collectives)
        self._slowest_save_s = 0.0
        self._save_t0 = 0.0
        self._progress: dict[str, int] = {}
        self.checksum_s = 0.0  # this rank's seconds spent on checksums by the last commit
        # Host buffers for async saves, reused by every save of the run (pinned for GPU tensors; shared memory for
        # a writer process), an in-place survivor's kept across recoveries (``stager``: checkpoint.host_buffers).
        # The writer process, if chosen, starts here: once, before the first step.
        self._stager = stager or ReusedBufferStager(shared=self.cfg.writer == "process")
        self._writes = start_writes(self.cfg.writer if self.cfg.async_save else "thread", site, self._stager)

    @property
    def root(self) -> Path:
        return self.site.root

    def prepare(self, state: dict[str, Any]) -> None:
        """Allocate the async saves' host buffers now, at start, instead of on the first save's step (shared memory
        for a writer process: ~1 s for the debug preset on CPU). Only for a state whose optimizer already has its
        buffers (a resumed one): taking a state dict of a fresh optimizer would initialise it with a step."""
        if self.cfg.async_save:
            self._writes.prepare(state)

    def due(self, step: int) -> bool:
        return step % self.cfg.interval == 0

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        force: bool = False,
        sync: bool = False,
        progress: dict[str, int] | None = None,
    ) -> float:
        """Save `state` at `step` if the policy says so (or `force`). Returns the seconds training was blocked.

        Raises CheckpointStorageError if a synchronous save fails (the previous checkpoint stays intact)."""
        if not (force or self.due(step)):
            return 0.0
        self.before_save(step)
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        self.raise_failure()
        self._bound_collectives()
        self._save_t0 = begun = time.perf_counter()  # how long a save takes leaves out the wait for the previous one
        path = step_dir(self.root, step)
        problem = None
        if self.site.rank == 0:
            try:
                if path.exists():
                    if not is_ours(path):
                        raise OSError(f"{path} exists and was not written by this job; it is left alone")
                    remove_ours(path)  # a leftover of an earlier attempt at this step (crash, rerun)
                self._make_step_dir(step, path)
            except OSError as e:
                problem = self._failure_text(step, e)
        problem = self.site.agree(problem)
        if problem:
            raise CheckpointStorageError(problem)
        self.during_save(step)
        self._progress = dict(progress or {})
        group = self.site.group
        if self.cfg.async_save and not sync:
            done = threading.Event()
            fut = self._writes.save(state, str(path), self.collective_timeout_s)
            fut.add_done_callback(lambda f, s=step, e=done: self._on_async_done(f, s, e))
            self._pending = (step, fut, done)
        else:
            try:
                dcp.save(state, storage_writer=StepDirWriter(str(path)), process_group=group)
                self._commit(step)
                self._timed(begun)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - reported with its reason
                self._discard(step)
                kind, text = self._classify(step, e)
                raise kind(text) from None
            # Nobody leaves before rank 0's marker is down: a sync save precedes an exit (signal, last step),
            # and a rank exiting early makes torchrun/srun tear down the others, rank 0 mid-commit included.
            dist.barrier(group=group)
        return time.perf_counter() - t0

    def _make_step_dir(self, step: int, path: Path) -> None:
        """Rank 0: create `path` with its ownership file already inside (scratch name, then one rename)."""
        for old in self.root.iterdir():  # scratch left by a start killed between mkdir and rename
            if SCRATCH_RE.match(old.name):
                shutil.rmtree(old, ignore_errors=True)
        scratch = self.root / f".{path.name}.new-{os.getpid()}"
        scratch.mkdir(parents=True)
        (scratch / OWNED).write_text(json.dumps({"step": step, "created": time.time()}))
        os.rename(scratch, path)

    # ---- failures ----------------------------------------------------------------------------------
    def _classify(self, step: int, e: BaseException) -> tuple[type[Exception], str]:
        """(PeerLost, why) when a collective lost a peer, else (CheckpointStorageError, why)."""
        if isinstance(e, StaleGroup):  # the commit fence refused it: its own line, its own exit code
            return StaleGroup, str(e)
        peer = peer_reason(e)
        if peer:
            return PeerLost, (
                f"the checkpoint of step {step} was not completed: {peer}; the checkpoint collectives "
                f"wait {self.collective_timeout_s:.0f} s. The job restarts from the newest complete "
                "checkpoint"
            )
        return CheckpointStorageError, self._failure_text(step, e)

    def raise_failure(self) -> None:
        """Raise the failure of the last async save, if it failed (PeerLost or CheckpointStorageError)."""
        if self.failure:
            raise self._failure_kind(self.failure)

    def _failure_text(self, step: int, e: BaseException) -> str:
        good = latest_complete(self.root) if self.site.rank == 0 else None
        kept = f"the newest complete checkpoint {good} is intact" if good else "no earlier checkpoint exists"
        return (
            f"the checkpoint of step {step} could not be written to {self.root}: {storage_reason(e, self.root)}. "
            f"Training stopped; {kept}. Free space or fix the directory, then rerun to resume"
        )

    def _discard(self, step: int) -> None:
        """Rank 0: remove the incomplete directory of a failed save (ours, never committed) to free space."""
        if self.site.rank == 0:
            remove_ours(step_dir(self.root, step), ignore_errors=True)  # else left for a later save's _prune

    # ---- how long collectives wait -----------------------------------------------------------------
    def _timed(self, t0: float) -> None:
        self._slowest_save_s = max(self._slowest_save_s, time.perf_counter() - t0)

    def _bound_collectives(self) -> None:
        """Main thread, nothing in flight: checkpoint collectives wait SAVE_TIMEOUT_FACTOR x the slowest save
        so far (at least min_timeout_s, at most timeout_s) instead of timeout_s."""
        bound = choose.collective_bound(self._slowest_save_s, self.cfg.min_timeout_s, self.cfg.timeout_s)
        if bound is None or bound == self.collective_timeout_s:
            return
        (self.site.group or dist.group.WORLD).set_timeout(timedelta(seconds=bound))  # in place, all ranks
        if self.site.rank == 0 and self.collective_timeout_s == self.cfg.timeout_s:
            log.info(
                "checkpoint collectives now wait at most %.0f s for a peer (the slowest save took %.2f s; "
                "checkpoint.min_timeout_s %.0f, timeout_s %.0f)",
                bound,
                self._slowest_save_s,
                self.cfg.min_timeout_s,
                self.cfg.timeout_s,
            )
        self.collective_timeout_s = bound

    # ---- completion --------------------------------------------------------------------------------
    def _on_async_done(self, fut, step: int, done: threading.Event) -> None:
        try:
            fut.result()
            if self._abandoned:  # (its group is gone; the step may be saved again by the new group's manager)
                return
            self._commit(step)
            self._timed(self._save_t0 + self._writes.take_start_wait())
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - the trainer stops at the next step
            if self._abandoned:  # nobody reads it; and its directory may be the new group's save of the same step
                return
            self._failure_kind, self.failure = self._classify(step, e)  # raised at the next step, said once
            self._discard(step)
        finally:
            done.set()

    @property
    def in_flight(self) -> bool:
        """An async save is being written (or committed) in the background now."""
        return self._pending is not None and not self._pending[2].is_set()

    def wait(self) -> None:
        """Block until the in-flight async save (if any) is written and committed (or has failed)."""
        if self._pending is not None:
            _, _, done = self._pending
            done.wait()
            self._pending = None

    def _commit(self, step: int) -> None:
        """Collective: checksum the files (each rank its share), then rank 0 writes the commit marker."""
        path = step_dir(self.root, step)
        sizes = None
        if self.site.rank == 0:
            sizes = {
                f.name: f.stat().st_size
                for f in sorted(path.iterdir())
                if f.is_file() and f.name not in (MARKER, MARKER + ".tmp")
            }
        sizes = self.site.agree(sizes)
        t0 = time.perf_counter()
        try:
            mine: Any = {n: crc32c_file(path / n) for n in share(sizes, self.site.rank, self.site.world_size)}
        except OSError as e:
            mine = e  # reported on rank 0 after the gather, so no rank waits for a peer that gave up
        self.checksum_s = time.perf_counter() - t0
        gathered: list[Any] = [None] * self.site.world_size
        dist.all_gather_object(gathered, mine, group=self.site.group)
        errors = [g for g in gathered if isinstance(g, BaseException)]
        if errors:
            raise errors[0]
        if self.site.rank != 0:
            return
        sums = {n: c for g in gathered for n, c in g.items()}
        fenced = self.before_commit(step) or {}  # the commit fence's fields (training.checkpoint.fence)
        record = {
            "format": 2,
            "step": step,
            "world_size": self.site.world_size,
            "signature": self.signature,
            "run": self.fingerprint,
            "progress": self._progress,
            "files": {n: {"size": s, "crc32c": sums[n]} for n, s in sizes.items()},
            "time": time.time(),
            **fenced,
        }
        tmp = path / (MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / MARKER)  # atomic: the marker is either absent or whole
        self.on_commit(step)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest `keep_last` complete checkpoints; drop our older ones and our older unfinished saves.

        Committed checkpoints that no longer verify are not touched here (they are quarantined when a load
        meets them); directories this project did not create are never touched."""
        good, bad = scan(self.root)
        paths = {parse_step(p): p for p in good} | {parse_step(b): b for b, _ in bad if not (b / MARKER).exists()}
        unfinished = [parse_step(b) for b, _ in bad if not (b / MARKER).exists()]
        for s in choose.prune_victims([parse_step(p) for p in good], unfinished, self.cfg.keep_last):
            remove_ours(paths[s], ignore_errors=True)

    def close(self, wait_s: float | None = None) -> None:
        """Wait for the save in flight, then release the writer. ``wait_s`` bounds the wait (an in-place recovery:
        the save's collectives run on the old group, and a rank the recovery lost never joins them, so it would
        wait for that group's timeout while the new group's first collective waits for this rank): past it the
        save is abandoned, said in one line; it never commits nor removes anything afterwards, and its writer is
        released once its thread ends."""
        if wait_s is not None and self._pending is not None:
            step, _, done = self._pending
            if not done.wait(wait_s):
                self._abandoned, self._pending = True, None
                log.warning(
                    "WARNING: rank %d: the checkpoint save of step %d in flight was abandoned by the in-place "
                    "recovery (its collectives are on the old group; it is never committed, as after a restart)",
                    self.site.rank,
                    step,
                )
                self._writes.abandon()
                threading.Thread(
                    target=self._release_after, args=(done,), name="t5f-abandoned-save", daemon=True
                ).start()
                return
        try:
            self.wait()
        finally:
            self._release()

    def _release_after(self, done: threading.Event) -> None:
        done.wait()
        self._release()

    def _release(self) -> None:
        try:
            self._writes.close()
        finally:
            self._stager.close()

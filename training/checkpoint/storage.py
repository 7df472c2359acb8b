"""The storage tier: DCP checkpoints on shared storage, committed, verified, with fallback and retention.

Layout: ``<dir>/step_00000010/`` holds the torch.distributed.checkpoint (DCP) files of every rank, an
ownership file ``.t5-failover`` written when the directory is created, and ``COMMITTED.json``, written by
rank 0 only after every rank's data and DCP's ``.metadata`` are on disk (for async saves: after the
background write finished). The marker records each file's size and CRC32C (computed by the background
writer, split over the ranks) and the run's fingerprint (:mod:`training.checkpoint.run_identity`).

Rules that keep a user's data safe:

* only directories this project created (ownership file, or a commit marker of ours) are ever loaded,
  pruned or overwritten; anything else in ``checkpoint.dir`` is left alone, with one warning at start;
* "latest" is the newest *complete* checkpoint whose files match their sizes and checksums; a checkpoint
  that fails verification or loading is moved to ``<dir>/quarantine/`` (never deleted) and the previous
  one is used;
* a checkpoint of another model shape (exit 3) or another run (exit 4) is never loaded;
* a checkpoint.dir inside another run's checkpoints, or holding another run's, is refused at start
  (:func:`training.checkpoint.layout.nesting_problem`, exit 2), as is one that cannot be written;
* a failed save is reported at the next step boundary with its reason (exit 6), the previous complete
  checkpoint untouched.

Call ``save(step, state)`` after every step; the tier saves the steps its interval makes due (or when forced).
:class:`StorageTier` is the one object the checkpoint manager holds; the work is done by its parts, one idea each:
the start checks (:mod:`~training.checkpoint.storage_start`), the writer (save, commit, prune:
:mod:`~training.checkpoint.storage_writer`), the reader (discover, verify, load, quarantine:
:mod:`~training.checkpoint.storage_reader`) and their pure decisions (:mod:`~training.checkpoint.storage_choices`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from training.checkpoint import storage_start
from training.checkpoint.layout import (  # noqa: F401 - re-exported: callers import the layout's names from here
    OWNED,
    foreign_entries,
    is_ours,
    latest_complete,
    parse_step,
    step_dir,
)
from training.checkpoint.run_identity import Change
from training.checkpoint.staging import ReusedBufferStager
from training.checkpoint.storage_choices import SAVE_TIMEOUT_FACTOR  # noqa: F401 - re-exported
from training.checkpoint.storage_reader import StorageReader
from training.checkpoint.storage_site import StorageSite
from training.checkpoint.storage_writer import StorageWriter
from training.config import CheckpointConfig


class StorageTier:
    """Saves (sync or async on its own gloo group), commits, discovers, verifies, loads with fallback, prunes.

    `fingerprint` identifies the run (see training.checkpoint.run_identity); `accept` names the fingerprint fields a
    resume may change. `before_save` runs (on every rank) right before a checkpoint is taken, e.g. a check
    that the state is finite; it may raise to prevent the save. `during_save` (once the step's directory is
    agreed) and `before_commit` (data written, marker not yet) are fault-injection points; `before_commit` is also
    the commit fence (training.checkpoint.fence): what it returns goes into the marker, and what it raises fails
    the commit.
    When and what to save and restore is decided by the owner of both tiers (training.checkpoint.manager).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        rank: int,
        world_size: int,
        signature: dict[str, Any],
        fingerprint: dict[str, Any] | None = None,
        accept: set[str] = frozenset(),
        before_save: Callable[[int], None] | None = None,
        during_save: Callable[[int], None] | None = None,
        before_commit: Callable[[int], dict | None] | None = None,
        on_commit: Callable[[int], None] | None = None,
        stager: ReusedBufferStager | None = None,
    ):
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.signature = signature
        fingerprint = fingerprint or {}
        # Checkpoint collectives get their own gloo group: async saves run them on a background thread
        # without racing the training group, and a slow writer is not cut off by the short training timeout.
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))
        self.site = StorageSite(cfg, Path(cfg.dir), rank, world_size, group)
        self.writer = StorageWriter(
            self.site,
            signature=signature,
            fingerprint=fingerprint,
            before_save=before_save or (lambda step: None),
            during_save=during_save or (lambda step: None),  # fault injection: after the directory is agreed
            before_commit=before_commit or (lambda step: None),
            on_commit=on_commit or (lambda step: None),
            stager=stager,
        )
        self.reader = StorageReader(self.site, signature=signature, fingerprint=fingerprint, accept=accept)

    # ---- where ----------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.site.root

    @root.setter
    def root(self, path: Path) -> None:  # a test re-saves a loaded state elsewhere
        self.site.root = Path(path)

    @property
    def group(self):
        return self.site.group

    # ---- start-up checks ------------------------------------------------------------------------
    def check_storage(self, checkpoint_bytes: int) -> None:
        """Before training: the directory is writable and has room for one more checkpoint (rank 0 checks)."""
        storage_start.check_storage(self.site, checkpoint_bytes)

    def lineage(self) -> str:
        """Collective: the id of the run this directory holds (see storage_start.lineage)."""
        return storage_start.lineage(self.site)

    def check_no_clash(self, first_step: int, last_step: int) -> None:
        """Refuse to start if a foreign directory sits where this run will save (it would be overwritten)."""
        storage_start.check_no_clash(self.site, first_step, last_step)

    # ---- reading --------------------------------------------------------------------------------
    @property
    def accepted(self) -> list[Change]:
        """The run-setting changes the loaded checkpoint was accepted with."""
        return self.reader.accepted

    def load(self, state: dict[str, Any]) -> dict[str, Any] | None:
        return self.reader.load(state)

    def load_initial(self, path: str, state: dict[str, Any]) -> int:
        return self.reader.load_initial(path, state)

    initial_load_signature = staticmethod(StorageReader.initial_load_signature)

    # ---- writing --------------------------------------------------------------------------------
    def prepare(self, state: dict[str, Any]) -> None:
        self.writer.prepare(state)

    def due(self, step: int) -> bool:
        return self.writer.due(step)

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        force: bool = False,
        sync: bool = False,
        progress: dict[str, int] | None = None,
    ) -> float:
        return self.writer.save(step, state, force=force, sync=sync, progress=progress)

    def wait(self) -> None:
        self.writer.wait()

    def raise_failure(self) -> None:
        self.writer.raise_failure()

    @property
    def failure(self) -> str | None:
        """Why the last async save failed, once known."""
        return self.writer.failure

    @property
    def checksum_s(self) -> float:
        """This rank's seconds spent on checksums by the last commit."""
        return self.writer.checksum_s

    @property
    def collective_timeout_s(self) -> float:
        return self.writer.collective_timeout_s

    @property
    def _slowest_save_s(self) -> float:  # tests steer the collectives' bound through it
        return self.writer._slowest_save_s

    @_slowest_save_s.setter
    def _slowest_save_s(self, seconds: float) -> None:
        self.writer._slowest_save_s = seconds

    def _discard(self, step: int) -> None:
        self.writer._discard(step)

    def close(self, wait_s: float | None = None) -> None:
        """Release the writer after the save in flight (at most ``wait_s``: :meth:`StorageWriter.close`)."""
        self.writer.close(wait_s)

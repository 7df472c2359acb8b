"""The storage tier's reading half: discover the complete checkpoints, verify them, load one, quarantine the damaged.

"Latest" is the newest complete checkpoint whose files match their committed sizes and CRC32C; one that fails
verification or loading is moved to ``<dir>/quarantine/`` (never deleted) and the previous one is tried. A
checkpoint of another model shape (exit 3) or of another run (exit 4) is never loaded. Rank 0 scans and decides;
every rank then takes the same branch (:class:`~training.checkpoint.storage_site.StorageSite`'s collectives).
The decisions themselves are pure (:mod:`training.checkpoint.storage_choices`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint import storage_choices as choose
from training.checkpoint.integrity import crc32c_file, share, storage_reason
from training.checkpoint.layout import (
    MARKER,
    QUARANTINE,
    ROLLBACK,
    SUPERSEDED,
    _file_sizes,
    latest_complete,
    parse_step,
    read_marker,
    scan,
    verify,
)
from training.checkpoint.run_identity import ALWAYS_ACCEPTED, Change, diff, show
from training.checkpoint.storage_site import StorageSite
from training.config import ConfigError
from training.errors import CheckpointIncompatible, RunChanged

log = logging.getLogger("training.checkpoint")


class StorageReader:
    """Loads the newest complete, verified checkpoint of this run (or another run's model, to start from)."""

    def __init__(self, site: StorageSite, *, signature: dict[str, Any], fingerprint: dict[str, Any], accept: set[str]):
        self.site = site
        self.signature = signature
        self.fingerprint = fingerprint
        self.accept = set(accept)
        self.accepted: list[Change] = []

    @property
    def root(self) -> Path:
        return self.site.root

    def _candidates(self) -> list[str]:
        """Rank 0 scans and broadcasts, so every rank tries the same checkpoints in the same order."""
        problem = None
        if self.site.rank == 0:
            try:
                self._maybe_roll_back()
            except ConfigError as e:
                problem = e
        problem = self.site.agree(problem)
        if isinstance(problem, ConfigError):
            raise problem
        good_paths = None
        if self.site.rank == 0:
            good, bad = scan(self.root)
            by_step = {parse_step(p): p for p, _ in bad}
            found = choose.triage(
                [choose.Unloadable(parse_step(p), (p / MARKER).exists(), why) for p, why in bad],
                parse_step(good[0]) if good else None,
            )
            for b in found.quarantine:  # committed once, now damaged: keep it for inspection
                self._quarantine(by_step[b.step], b.why)
            for b in found.skip:
                log.warning("WARNING: skipping checkpoint %s: %s; falling back to an older one", by_step[b.step], b.why)
            good_paths = [str(p) for p in good]
        return self.site.agree(good_paths)

    def _maybe_roll_back(self) -> None:
        """Rank 0, for checkpoint.load_step: move newer checkpoints to superseded/ once per requested step, so
        the run resumes there and later restarts (same flags) continue from the newest again."""
        want = self.site.cfg.load_step
        marker = self.root / ROLLBACK
        done = json.loads(marker.read_text()) if want and marker.is_file() else {}
        good = {parse_step(p): p for p in scan(self.root)[0]} if want else {}
        plan = choose.rollback(want, done.get("load_step"), list(good))
        if plan is None:
            return
        if plan.applied_before:
            log.info(
                "checkpoint.load_step=%d was applied at %s; resuming from the newest checkpoint",
                want,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.get("time", 0))),
            )
            return
        if plan.missing:
            raise ConfigError(
                f"checkpoint.load_step={want}: {self.root} has no complete checkpoint of step {want}; "
                f"complete ones: {list(good) or 'none'}"
            )
        moved = []
        for s in plan.supersede:
            p = good[s]
            dest = self.root / SUPERSEDED / f"{p.name}.{int(time.time())}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, dest)
            moved.append(str(dest))
        marker.write_text(json.dumps({"load_step": want, "time": time.time(), "superseded": moved}))
        if moved:
            log.warning(
                "checkpoint.load_step=%d: moved %d newer checkpoint(s) to %s (kept, not loaded)",
                want,
                len(moved),
                self.root / SUPERSEDED,
            )

    @staticmethod
    def initial_load_signature(path: str) -> Any:
        """The model signature recorded by the checkpoint ``path`` names (as load_initial resolves it), or None."""
        root = Path(path)
        target = root if (root / MARKER).exists() else latest_complete(root)
        try:
            return read_marker(target).get("signature") if target else None
        except (OSError, ValueError, AttributeError):
            return None

    def load_initial(self, path: str, state: dict[str, Any]) -> int:
        """Load `state` (e.g. {"train": ModelOnly(model)}) from another run's checkpoint; returns its step.

        `path` is a step directory or a checkpoint.dir (its newest complete checkpoint). Verified like a resume."""
        root = Path(path)
        target = root if (root / MARKER).exists() else latest_complete(root)
        problem = None
        if self.site.rank == 0:
            ok, why = verify(target) if target else (False, "no complete checkpoint there")
            problem = None if ok else f"checkpoint.initial_load_path={path!r}: {why}"
        problem = self.site.agree(problem)
        if problem:
            raise ConfigError(problem)
        info = read_marker(target)
        if info.get("signature") != self.signature:
            raise CheckpointIncompatible(
                f"checkpoint.initial_load_path {target} holds model {info.get('signature')}, but this run's model "
                f"is {self.signature}; use matching model settings"
            )
        problem = self._verify_checksums(target)
        if problem:  # a bad input, not another model: exit 2
            raise ConfigError(
                f"checkpoint.initial_load_path {target} is damaged: {problem}; pass another checkpoint "
                "(e.g. an older step_NNNNNNNN directory of that run)"
            )
        dcp.load(state, checkpoint_id=str(target), process_group=self.site.group)
        return info["step"]

    def _quarantine(self, path: Path, why: str) -> None:
        """Rank 0: move a damaged checkpoint aside (never delete it) and say so in one line."""
        if self.site.rank != 0:
            return
        dest = self.root / QUARANTINE / f"{path.name}.{int(time.time())}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
            (dest / "QUARANTINED.txt").write_text(f"{why}\n")
            where = f"moved to {dest}"
        except OSError as e:
            where = f"could not be moved aside ({e}); it stays in place and is skipped"
        log.warning("WARNING: checkpoint %s is damaged: %s; %s; falling back to an older one", path, why, where)

    def _verify_checksums(self, path: Path) -> str | None:
        """Every rank checksums its share of the files; the first mismatch (agreed on every rank) or None."""
        problem = None
        try:
            files = read_marker(path)["files"]
            sums = {n: v["crc32c"] for n, v in files.items() if isinstance(v, dict) and "crc32c" in v}
            mine = share({n: _file_sizes({"files": files})[n] for n in sums}, self.site.rank, self.site.world_size)
            for name in mine:
                got = crc32c_file(path / name)
                if got != sums[name]:
                    problem = f"file {path / name} fails its checksum (crc32c {got}, {sums[name]} was written)"
                    break
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"cannot verify {path}: {e}"
        return self.site.first_of_all(problem)

    def _check_identity(self, path: Path, info: dict[str, Any], progress: dict[str, int]) -> None:
        saved = info.get("run")
        verdict = choose.identity(
            info.get("signature"),
            self.signature,
            saved,
            diff(saved, self.fingerprint) if saved is not None else [],
            self.accept | ALWAYS_ACCEPTED,
        )
        if verdict.other_model:
            raise CheckpointIncompatible(
                f"checkpoint {path} was written for model {info.get('signature')}, but this run's model is "
                f"{self.signature}. Use the model settings it was written with, or point checkpoint.dir "
                f"at a new directory to start fresh (nothing was loaded or overwritten)"
            )
        if verdict.unrecorded:
            if self.site.rank == 0 and self.fingerprint:
                log.warning(
                    "WARNING: checkpoint %s records no run settings (written by an older version); "
                    "resuming without checking them",
                    path,
                )
            return
        step, offset = progress.get("step", info["step"]), progress.get("data_offset", 0)
        if verdict.refused:
            lines = "\n".join(f"  {c.field}: {show(c.saved)} -> {show(c.now)}" for c in verdict.refused)
            effects = "\n".join(f"  {c.field}: {c.effect(step, offset)}" for c in verdict.refused)
            raise RunChanged(
                f"the newest checkpoint {path} belongs to a run with other settings:\n{lines}\n"
                f"Nothing was loaded, changed or deleted. Either start a new run elsewhere "
                f"(--job.out_dir DIR, or --checkpoint.dir DIR), or continue this one with the change:\n"
                f"  --checkpoint.accept_changes {','.join(c.field for c in verdict.refused)}\n"
                f"which does this:\n{effects}"
            )
        self.accepted = verdict.accepted

    def load(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Load the newest complete, verified checkpoint into the Stateful objects in `state`.

        Returns its commit record, or None for a fresh start. Raises CheckpointIncompatible (another model)
        or RunChanged (other run settings, not accepted) without loading anything. A checkpoint that fails
        verification or loading is quarantined and the previous one is tried. Keys absent from a checkpoint
        (per-rank RNG of ranks that did not exist) are left as they are.
        """
        for path in self._candidates():
            p = Path(path)
            info = read_marker(p)
            self._check_identity(p, info, info.get("progress", {}))
            problem = self._verify_checksums(p)
            if problem is None:
                try:
                    stored = dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata
                    held = choose.stored_entries(state, stored)
                    wanted = {k: v for k, v in state.items() if k in held}
                    dcp.load(wanted, checkpoint_id=str(p), process_group=self.site.group)
                except (Exception, CheckpointException) as e:  # noqa: BLE001 - any read failure: previous one
                    problem = f"it could not be loaded ({storage_reason(e)})"
            # Every rank must take the same branch, whatever it saw itself.
            problem = self.site.first_of_all(problem)
            if problem:
                self._quarantine(p, problem)
                continue
            info["missing_keys"] = sorted(set(state) - set(wanted))
            return info
        return None

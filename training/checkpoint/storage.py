"""Checkpoint manager: owns the save policy, commit markers, discovery, verification, fallback and retention.

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
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint.layout import (
    LINEAGE,
    MARKER,
    OWNED,
    PREFIX,
    PROBE,
    QUARANTINE,
    ROLLBACK,
    SCRATCH_RE,
    SUPERSEDED,
    _file_sizes,
    foreign_entries,
    is_ours,
    latest_complete,
    parse_step,
    read_marker,
    remove_ours,
    scan,
    step_dir,
    verify,
)
from training.config import CheckpointConfig
from training.config import ConfigError
from training.errors import CheckpointIncompatible, CheckpointStorageError, PeerLost, RunChanged, StaleGroup
from training.checkpoint.integrity import crc32c_file, peer_reason, share, storage_reason
from training.checkpoint.run_identity import ALWAYS_ACCEPTED, Change, diff, show
from training.checkpoint.staging import ReusedBufferStager
from training.torch_private import set_pg_timeout

log = logging.getLogger("training.checkpoint")
#: Once a save has been timed, checkpoint collectives wait this many times the slowest save so far (see
#: checkpoint.min_timeout_s): room for a slow file-system moment, yet a silent peer costs about a save, not an hour.
SAVE_TIMEOUT_FACTOR = 4


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
    ):
        self.cfg = cfg
        self.root = Path(cfg.dir)
        self.rank, self.world_size = rank, world_size
        self.signature = signature
        self.fingerprint = fingerprint or {}
        self.accept = set(accept)
        self.accepted: list[Change] = []
        self.before_save = before_save or (lambda step: None)
        self.during_save = during_save or (lambda step: None)  # fault injection: after the directory is agreed
        self.before_commit = before_commit or (lambda step: None)
        self.on_commit = on_commit or (lambda step: None)
        # Checkpoint collectives get their own gloo group: async saves run them on a background thread
        # without racing the training group, and a slow writer is not cut off by the short training timeout.
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))
        self._pending: tuple[int, Any, threading.Event] | None = None
        self.failure: str | None = None  # why the last async save failed, once known
        self._failure_kind: type[Exception] = CheckpointStorageError
        self.collective_timeout_s = cfg.timeout_s  # lowered once a save has been timed (_bound_collectives)
        self._slowest_save_s = 0.0
        self._save_t0 = 0.0
        self.checksum_s = 0.0  # this rank's seconds spent on checksums by the last commit
        # Host buffers for async saves, reused by every save of the run (pinned for GPU tensors).
        self._stager = ReusedBufferStager()

    # ---- start-up checks ---------------------------------------------------------------------------
    def _agree(self, problem: str | None) -> str | None:
        """Rank 0's finding, on every rank."""
        payload = [problem]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        return payload[0]

    def check_storage(self, checkpoint_bytes: int) -> None:
        """Before training: the directory is writable and has room for one more checkpoint (rank 0 checks)."""
        problem = None
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                probe = self.root / f"{PROBE}-{os.getpid()}"
                with open(probe, "wb") as f:
                    f.write(b"\0" * 4096)
                    f.flush()
                    os.fsync(f.fileno())
                probe.unlink()
                free = shutil.disk_usage(self.root).free
                if free < checkpoint_bytes:
                    problem = (
                        f"checkpoint.dir {self.root} has {free / 1e6:,.0f} MB free, but one checkpoint of "
                        f"this run needs about {checkpoint_bytes / 1e6:,.0f} MB: free space there or point "
                        "--checkpoint.dir at a larger file system"
                    )
            except OSError as e:
                problem = (
                    f"checkpoint.dir {self.root} is not writable: {storage_reason(e)}; point "
                    "--checkpoint.dir at a writable directory"
                )
            foreign = foreign_entries(self.root) if problem is None else []
            if foreign:
                shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
                log.warning(
                    "WARNING: checkpoint.dir %s also holds entries this job did not write (%s); they are "
                    "never loaded, pruned or overwritten. A directory of its own per run is safer.",
                    self.root,
                    shown,
                )
        problem = self._agree(problem)
        if problem:  # found before training: a location to fix, like the start checks' (exit 2)
            raise ConfigError(problem)

    def lineage(self) -> str:
        """Collective: the id of the run this directory holds, made by its first start (rank 0) and read by every
        later one. In-memory snapshots carry it: a directory emptied for a fresh start never gets an old one."""
        token = None
        if self.rank == 0:
            path = self.root / LINEAGE
            try:
                token = path.read_text().strip()
            except OSError:
                token = ""
            if not token:
                token = secrets.token_hex(8)
                tmp = path.with_name(f"{LINEAGE}.tmp{os.getpid()}")
                tmp.write_text(token)
                os.replace(tmp, path)
        return self._agree(token)

    def check_no_clash(self, first_step: int, last_step: int) -> None:
        """Refuse to start if a foreign directory sits where this run will save (it would be overwritten)."""
        problem = None
        if self.rank == 0:
            clash = [
                p.name
                for p in sorted(self.root.glob(f"{PREFIX}*"))
                if p.is_dir()
                and (s := parse_step(p)) is not None
                and first_step <= s <= last_step
                and p.name == step_dir(self.root, s).name
                and not is_ours(p)
            ]
            if clash:
                problem = (
                    f"checkpoint.dir {self.root} holds {', '.join(clash[:5])}, which this job did not write "
                    "but would save into; move them, or point --checkpoint.dir at a directory of its own "
                    "(nothing was changed)"
                )
        problem = self._agree(problem)
        if problem:
            raise ConfigError(problem)

    # ---- discovery, verification and loading ---------------------------------------------------------
    def _candidates(self) -> list[str]:
        """Rank 0 scans and broadcasts, so every rank tries the same checkpoints in the same order."""
        payload: list[Any] = [None]
        if self.rank == 0:
            try:
                self._maybe_roll_back()
            except ConfigError as e:
                payload = [e]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        if isinstance(payload[0], ConfigError):
            raise payload[0]
        if self.rank == 0:
            good, bad = scan(self.root)
            newest_good = parse_step(good[0]) if good else -1
            for p, why in bad:
                if parse_step(p) > newest_good:
                    if (p / MARKER).exists():  # committed once, now damaged: keep it for inspection
                        self._quarantine(p, why)
                    else:
                        log.warning("WARNING: skipping checkpoint %s: %s; falling back to an older one", p, why)
            payload = [[str(p) for p in good]]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        return payload[0]

    def _maybe_roll_back(self) -> None:
        """Rank 0, for checkpoint.load_step: move newer checkpoints to superseded/ once per requested step, so
        the run resumes there and later restarts (same flags) continue from the newest again."""
        want = self.cfg.load_step
        if not want:
            return
        marker = self.root / ROLLBACK
        done = json.loads(marker.read_text()) if marker.is_file() else {}
        if done.get("load_step") == want:
            log.info(
                "checkpoint.load_step=%d was applied at %s; resuming from the newest checkpoint",
                want,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.get("time", 0))),
            )
            return
        good, _ = scan(self.root)
        if step_dir(self.root, want) not in good:
            raise ConfigError(
                f"checkpoint.load_step={want}: {self.root} has no complete checkpoint of step {want}; "
                f"complete ones: {[parse_step(p) for p in good] or 'none'}"
            )
        newer = [p for p in good if parse_step(p) > want]
        moved = []
        for p in newer:
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
        if self.rank == 0:
            ok, why = verify(target) if target else (False, "no complete checkpoint there")
            problem = None if ok else f"checkpoint.initial_load_path={path!r}: {why}"
        problem = self._agree(problem)
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
        dcp.load(state, checkpoint_id=str(target), process_group=self.group)
        return info["step"]

    def _quarantine(self, path: Path, why: str) -> None:
        """Rank 0: move a damaged checkpoint aside (never delete it) and say so in one line."""
        if self.rank != 0:
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
            for name in share({n: _file_sizes({"files": files})[n] for n in sums}, self.rank, self.world_size):
                got = crc32c_file(path / name)
                if got != sums[name]:
                    problem = f"file {path / name} fails its checksum (crc32c {got}, {sums[name]} was written)"
                    break
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"cannot verify {path}: {e}"
        found: list[Any] = [None] * self.world_size
        dist.all_gather_object(found, problem, group=self.group)
        return next((p for p in found if p), None)

    def _check_identity(self, path: Path, info: dict[str, Any], progress: dict[str, int]) -> None:
        if info.get("signature") != self.signature:
            raise CheckpointIncompatible(
                f"checkpoint {path} was written for model {info.get('signature')}, but this run's model is "
                f"{self.signature}. Use the model settings it was written with, or point checkpoint.dir "
                f"at a new directory to start fresh (nothing was loaded or overwritten)"
            )
        saved = info.get("run")
        if saved is None:
            if self.rank == 0 and self.fingerprint:
                log.warning(
                    "WARNING: checkpoint %s records no run settings (written by an older version); "
                    "resuming without checking them",
                    path,
                )
            return
        changes = diff(saved, self.fingerprint)
        refused = [c for c in changes if c.field not in self.accept | ALWAYS_ACCEPTED]
        step, offset = progress.get("step", info["step"]), progress.get("data_offset", 0)
        if refused:
            lines = "\n".join(f"  {c.field}: {show(c.saved)} -> {show(c.now)}" for c in refused)
            effects = "\n".join(f"  {c.field}: {c.effect(step, offset)}" for c in refused)
            raise RunChanged(
                f"the newest checkpoint {path} belongs to a run with other settings:\n{lines}\n"
                f"Nothing was loaded, changed or deleted. Either start a new run elsewhere "
                f"(--job.out_dir DIR, or --checkpoint.dir DIR), or continue this one with the change:\n"
                f"  --checkpoint.accept_changes {','.join(c.field for c in refused)}\n"
                f"which does this:\n{effects}"
            )
        self.accepted = changes

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
                    stored = set(dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata)
                    wanted = {k: v for k, v in state.items() if any(s == k or s.startswith(k + ".") for s in stored)}
                    dcp.load(wanted, checkpoint_id=str(p), process_group=self.group)
                except (Exception, CheckpointException) as e:  # noqa: BLE001 - any read failure: previous one
                    problem = f"it could not be loaded ({storage_reason(e)})"
            # Every rank must take the same branch, whatever it saw itself.
            found: list[Any] = [None] * self.world_size
            dist.all_gather_object(found, problem, group=self.group)
            problem = next((x for x in found if x), None)
            if problem:
                self._quarantine(p, problem)
                continue
            info["missing_keys"] = sorted(set(state) - set(wanted))
            return info
        return None

    # ---- saving ----------------------------------------------------------------------------------
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
        self._save_t0 = t0
        path = step_dir(self.root, step)
        problem = None
        if self.rank == 0:
            try:
                if path.exists():
                    if not is_ours(path):
                        raise OSError(f"{path} exists and was not written by this job; it is left alone")
                    remove_ours(path)  # a leftover of an earlier attempt at this step (crash, rerun)
                self._make_step_dir(step, path)
            except OSError as e:
                problem = self._failure_text(step, e)
        problem = self._agree(problem)
        if problem:
            raise CheckpointStorageError(problem)
        self.during_save(step)
        self._progress = dict(progress or {})
        if self.cfg.async_save and not sync:
            done = threading.Event()
            fut = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group, async_stager=self._stager)
            fut.add_done_callback(lambda f, s=step, e=done: self._on_async_done(f, s, e))
            self._pending = (step, fut, done)
        else:
            try:
                dcp.save(state, checkpoint_id=str(path), process_group=self.group)
                self._commit(step)
                self._timed(t0)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - reported with its reason
                self._discard(step)
                kind, text = self._classify(step, e)
                raise kind(text) from None
            # Nobody leaves before rank 0's marker is down: a sync save precedes an exit (signal, last step),
            # and a rank exiting early makes torchrun/srun tear down the others, rank 0 mid-commit included.
            dist.barrier(group=self.group)
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

    def _timed(self, t0: float) -> None:
        self._slowest_save_s = max(self._slowest_save_s, time.perf_counter() - t0)

    def _bound_collectives(self) -> None:
        """Main thread, nothing in flight: checkpoint collectives wait SAVE_TIMEOUT_FACTOR x the slowest save
        so far (at least min_timeout_s, at most timeout_s) instead of timeout_s."""
        if not self._slowest_save_s:
            return
        bound = min(self.cfg.timeout_s, max(self.cfg.min_timeout_s, SAVE_TIMEOUT_FACTOR * self._slowest_save_s))
        if bound != self.collective_timeout_s:
            set_pg_timeout(timedelta(seconds=bound), self.group)
            if self.rank == 0 and self.collective_timeout_s == self.cfg.timeout_s:
                log.info(
                    "checkpoint collectives now wait at most %.0f s for a peer (the slowest save took %.2f s; "
                    "checkpoint.min_timeout_s %.0f, timeout_s %.0f)",
                    bound,
                    self._slowest_save_s,
                    self.cfg.min_timeout_s,
                    self.cfg.timeout_s,
                )
            self.collective_timeout_s = bound

    def _failure_text(self, step: int, e: BaseException) -> str:
        good = latest_complete(self.root) if self.rank == 0 else None
        kept = f"the newest complete checkpoint {good} is intact" if good else "no earlier checkpoint exists"
        return (
            f"the checkpoint of step {step} could not be written to {self.root}: {storage_reason(e, self.root)}. "
            f"Training stopped; {kept}. Free space or fix the directory, then rerun to resume"
        )

    def _on_async_done(self, fut, step: int, done: threading.Event) -> None:
        try:
            fut.result()
            self._commit(step)
            self._timed(self._save_t0)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - the trainer stops at the next step
            self._failure_kind, self.failure = self._classify(step, e)  # raised at the next step, said once
            self._discard(step)
        finally:
            done.set()

    def _discard(self, step: int) -> None:
        """Rank 0: remove the incomplete directory of a failed save (ours, never committed) to free space."""
        if self.rank == 0:
            remove_ours(step_dir(self.root, step), ignore_errors=True)  # else left for a later save's _prune

    def wait(self) -> None:
        """Block until the in-flight async save (if any) is written and committed (or has failed)."""
        if self._pending is not None:
            _, _, done = self._pending
            done.wait()
            self._pending = None

    def _commit(self, step: int) -> None:
        """Collective: checksum the files (each rank its share), then rank 0 writes the commit marker."""
        path = step_dir(self.root, step)
        sizes: list[Any] = [None]
        if self.rank == 0:
            sizes = [
                {
                    f.name: f.stat().st_size
                    for f in sorted(path.iterdir())
                    if f.is_file() and f.name not in (MARKER, MARKER + ".tmp")
                }
            ]
        dist.broadcast_object_list(sizes, src=0, group=self.group)
        t0 = time.perf_counter()
        try:
            mine: Any = {n: crc32c_file(path / n) for n in share(sizes[0], self.rank, self.world_size)}
        except OSError as e:
            mine = e  # reported on rank 0 after the gather, so no rank waits for a peer that gave up
        self.checksum_s = time.perf_counter() - t0
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.group)
        errors = [g for g in gathered if isinstance(g, BaseException)]
        if errors:
            raise errors[0]
        if self.rank != 0:
            return
        sums = {n: c for g in gathered for n, c in g.items()}
        fenced = self.before_commit(step) or {}  # the commit fence's fields (training.checkpoint.fence)
        record = {
            "format": 2,
            "step": step,
            "world_size": self.world_size,
            "signature": self.signature,
            "run": self.fingerprint,
            "progress": self._progress,
            "files": {n: {"size": s, "crc32c": sums[n]} for n, s in sizes[0].items()},
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
        if len(good) <= self.cfg.keep_last:
            return
        oldest_kept = parse_step(good[self.cfg.keep_last - 1])
        unfinished = [b for b, _ in bad if not (b / MARKER).exists()]
        for p in good[self.cfg.keep_last :] + unfinished:
            if parse_step(p) < oldest_kept:
                remove_ours(p, ignore_errors=True)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._stager.close()

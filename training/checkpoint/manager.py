"""The checkpoint policy's one owner: which tier to save to after a step, and which to restore from at start.

Two tiers (``training.checkpoint``'s storage checkpoints, ``training.checkpoint.memory``'s in-memory snapshots on the
node and a peer). The trainer only asks::

    ckpt = CheckpointManager(cfg.checkpoint, rank=0, world=2, ..., checkpoint_bytes=12 * n_params)
    step = ckpt.restore(state, model_only)       # newest of: memory/peer snapshot, storage checkpoint; None = fresh
    ckpt.before_optimizer_step()                 # the snapshot in flight must be copied before the state changes
    storage_s, memory_s = ckpt.save(step, state, stop=..., final=..., progress=...)  # seconds blocked
    ckpt.close(discard_memory=finished)
    # an in-place recovery instead: kept = ckpt.hand_over_host_buffers(); ckpt.close_after_recovery(bound_s);
    # then CheckpointManager(..., host=kept) for the new group reuses both tiers' host buffers

Policy:

* **save**: storage every ``checkpoint.interval`` steps, asynchronously; on a stop signal or the last step
  synchronously (the process exits right after); a memory snapshot every ``checkpoint.memory_interval`` steps on a
  background thread (overlapping the next step's forward and backward); ``auto``: as often as
  ``checkpoint.memory_budget`` allows (:mod:`training.checkpoint.snapshot_budget`), said in the log and recorded
  (event ``snapshot_interval``) when chosen and when it changes; a fixed interval over the budget is said once.
* **restore**: ``checkpoint.load_step`` names a storage step and wins; else the newest step some node's memory
  holds intact for every shard (CRC32C-checked: a damaged own-node copy is skipped for the peer's replica, a
  damaged replica too for an older step or storage, each named), when newer than the newest complete storage
  checkpoint; else storage (verified, with fallback); else a fresh start: the seed's initial weights (drawn only
  now: a restore overwrites them all), then ``checkpoint.initial_load_path``'s model weights when set.
  ``restored_from`` (the ``start`` event's) lists the damaged generations skipped on the way.
* **failures**: a failed async save stops the run at the next step boundary (exit 6); a failed snapshot turns
  the memory tier off on every rank at the same step and training goes on with storage.
* **fence** (:mod:`training.checkpoint.fence`, on an etcd rendezvous; otherwise it does nothing): rank 0 asks
  etcd before each commit marker whether this group's round is still the current one; refused, every rank stops
  at the next step boundary (exit 9, one line). At restore, complete checkpoints a replaced group wrote are moved
  aside first, and the step restored from is recorded for this round.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Protocol

import torch

import torch.distributed as dist

from training.checkpoint import fence as commit_fence
from training.checkpoint import generation
from training.checkpoint.host_buffers import HostBuffers
from training.checkpoint.stale_rule import stale_checkpoints
from training.checkpoint.storage import StorageTier, latest_complete, parse_step
from training.config import CheckpointConfig
from training.errors import CheckpointStorageError, StaleGroup
from training.checkpoint.memory import MemoryTier
from training.checkpoint.run_identity import Change, parse_accept


class FaultPoints(Protocol):
    """Where fault injection reaches into the tiers (training.job.faults.Faults; each does nothing unless set)."""

    def mid_snapshot(self, step: int) -> None: ...
    def during_save(self, step: int) -> None: ...
    def before_commit(self, step: int) -> None: ...


class CheckpointManager:
    """Both tiers of one rank; collective methods are called by every rank at the same point."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        rank: int,
        world: int,
        device: torch.device,
        signature: dict[str, Any],
        fingerprint: dict[str, Any],
        checkpoint_bytes: int,
        faults: FaultPoints,
        before_save: Callable[[int], None],
        on_commit: Callable[[int], None],
        say: Callable[[str], None],
        on_save: Callable[[bool], None] = lambda sync: None,
        on_snapshot: Callable[[], None] = lambda: None,
        record: Callable[..., None] = lambda event, **fields: None,
        host: HostBuffers | None = None,
    ):
        self.cfg, self.signature, self.say, self.record = cfg, signature, say, record
        # both tiers' reused host buffers; an in-place survivor's previous manager handed them over
        self.host = host or HostBuffers.new(shared=cfg.writer == "process")
        # where a step's storage save (synchronous or not) and its memory snapshot begin (the trainer's progress)
        self.on_save, self.on_snapshot = on_save, on_snapshot
        self.fence = commit_fence.build(rank)
        self._fault_before_commit = faults.before_commit
        self.storage = StorageTier(
            cfg,
            rank=rank,
            world_size=world,
            signature=signature,
            fingerprint=fingerprint,
            accept=parse_accept(cfg.accept_changes),
            before_save=before_save,
            during_save=faults.during_save,
            before_commit=self._before_commit,
            on_commit=on_commit,
            stager=self.host.stager,
        )
        self.storage.check_storage(checkpoint_bytes=checkpoint_bytes)
        self.memory = MemoryTier.build(
            cfg,
            rank=rank,
            world=world,
            local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            checkpoint_dir=cfg.dir,
            device=device,
            identity={"signature": signature, "fingerprint": fingerprint, "lineage": self.storage.lineage()},
            mid_copy_hook=faults.mid_snapshot,
            host_pieces=self.host.pieces,
        )
        gen = generation.read()
        self.memory.round = gen.round if gen else None  # each snapshot carries it (the fence's restore rule)
        self.restored_from: dict | None = None
        """Where the state came from: {"tier": memory|peer|storage, "step", ...}; None for a fresh start."""
        self.sources: list[str] | None = None
        """Where each rank's state came from, by rank: 'own', 'peer', 'live' (memory: see
        :meth:`training.checkpoint.memory.MemoryTier.restore`), 'storage'; None for a fresh start."""

    def _before_commit(self, step: int) -> dict:
        """Rank 0, a checkpoint's data written: the fault point, then the fence (its fields go into the marker)."""
        self._fault_before_commit(step)
        return self.fence.commit(step)

    @property
    def accepted(self) -> list[Change]:
        """The run-setting changes the resumed checkpoint was accepted with (checkpoint.accept_changes)."""
        return self.storage.accepted

    # ---- restore ---------------------------------------------------------------------------------
    def restore(
        self,
        state: dict[str, Any],
        model_only: dict[str, Any],
        *,
        held: int | None = None,
        fresh_weights: Callable[[], None] = lambda: None,
    ) -> int | None:
        """Collective. Load the newest state (policy above) into ``state``; a fresh start calls ``fresh_weights``
        (the model's initial values: the trainer allocates the weights and draws them only when nothing is
        restored), then, with checkpoint.initial_load_path, loads ``model_only`` from there. Returns the step
        resumed, None if fresh.
        ``held``: the step ``state`` already holds at this rank and world size (a survivor of an in-place recovery
        whose shards did not move): when the memory tier chooses it, this rank reads nothing (``sources``: 'live').

        A resumed state has every buffer an async save copies: the storage tier allocates its copies now, not on
        the first save's step."""
        history = [self.fence.restores() or {}]  # rank 0's read of etcd (the others' fence does nothing)
        dist.broadcast_object_list(history, src=0, group=self.storage.group)
        restored = history[0]
        self.fence.set_aside_stale(self.storage.root, restored)  # rank 0, before any rank scans the directory
        self.memory.stale = lambda rnd, step: stale_checkpoints({step: rnd}, restored).get(step)
        dist.barrier(group=self.storage.group)
        step = self._restore(state, model_only, held, fresh_weights)
        self.fence.record_restore(step or 0)
        if step is not None:
            self.storage.prepare(state)
        return step

    def _restore(
        self, state: dict[str, Any], model_only: dict[str, Any], held: int | None, fresh_weights: Callable[[], None]
    ) -> int | None:
        newest = latest_complete(self.cfg.dir)
        storage_step = parse_step(newest) if newest else 0
        if not self.cfg.load_step:  # a chosen storage step wins over anything newer in memory
            got = self.memory.restore(state, storage_step=storage_step, held=held)
            if got is not None:
                self.sources = list(got.sources)
                where = (
                    "every rank from its own node"
                    if got.tier == "memory"
                    else "damaged or lost shards from their peers' replicas"
                    if got.skipped
                    else "shards of lost nodes from their peers' replicas"
                )
                if got.resharded_from:
                    where += f"; re-cut from world size {got.resharded_from} to {self.memory.world}"
                self.say(
                    f"restored step {got.step} from memory ({where}) in {got.seconds:.2f} s; newest storage "
                    f"checkpoint: step {storage_step}{_skipped_words(got.skipped)}"
                )
                self.restored_from = {"tier": got.tier, "step": got.step, "seconds": round(got.seconds, 3)}
                if got.resharded_from:
                    self.restored_from["resharded_from"] = got.resharded_from
                if got.skipped:
                    self.restored_from["skipped"] = list(got.skipped)
                self._say_initial_load_unused(got.step)
                return got.step
            if self.memory.skipped:
                then = (
                    f"restoring from storage (step {storage_step})"
                    if storage_step
                    else "no storage checkpoint is complete either: the run starts over from step 0"
                )
                self.say(
                    f"memory snapshots not used{_skipped_words(self.memory.skipped)}: no newer step is intact "
                    f"for every shard; {then}"
                )
        info = self.storage.load(state)
        if info is None:
            self.say(f"fresh start: no complete checkpoint in {self.cfg.dir}")
            fresh_weights()
            src = self.cfg.initial_load_path
            if src:
                step = self.storage.load_initial(src, model_only)
                self.say(f"model weights from {src} (step {step}); optimizer, schedule and data start fresh")
            return None
        self.say(
            f"resumed from step {info['step']} (saved at world size {info['world_size']}, now "
            f"{self.storage.world_size}) in {self.cfg.dir}"
        )
        self.restored_from = {"tier": "storage", "step": info["step"]}
        self.sources = ["storage"] * self.storage.world_size
        if self.memory.skipped and not self.cfg.load_step:
            self.restored_from["skipped"] = list(self.memory.skipped)
        self._say_initial_load_unused(info["step"])
        return info["step"]

    def _say_initial_load_unused(self, step: int) -> None:
        """checkpoint.initial_load_path only seeds a new run; a resume (which keeps the flags it was started with)
        ignores it, and says so, with a note when it would not even fit this model."""
        src = self.cfg.initial_load_path
        if not src or self.storage.rank != 0:  # one line per job: only rank 0 reads the other run's marker
            return
        other = self.storage.initial_load_signature(src)
        shape = (
            f"; note: it holds another model ({other}) than this run's ({self.signature})"
            if other is not None and other != self.signature
            else ""
        )
        self.say(
            f"checkpoint.initial_load_path={src} is not used: this run resumes its own step {step} "
            f"(initial_load_path only seeds a run that has no checkpoint yet; to start from it, use a new "
            f"--job.out_dir){shape}"
        )

    def check_no_clash(self, first_step: int, last_step: int) -> None:
        """Collective: refuse to start if a foreign directory sits where this run will save (exit 2)."""
        self.storage.check_no_clash(first_step, last_step)

    # ---- save ------------------------------------------------------------------------------------
    def before_optimizer_step(self) -> None:
        """The previous step's snapshot copies the state the optimizer is about to change: wait for it."""
        self.memory.wait()

    def due(self, step: int) -> bool:
        """Whether a storage save or a memory snapshot is due after `step` (a stop or the last step saves anyway)."""
        return self.storage.due(step) or self.memory.due(step)

    def save(
        self, step: int, state: dict[str, Any], *, stop: bool, final: bool, progress: dict[str, int]
    ) -> tuple[float, float]:
        """After `step`: storage if due (synchronous on a stop or the last step, which exit right after), then the
        memory snapshot if due. Returns the seconds training was blocked by each (storage, memory)."""
        must = stop or final
        waited = 0.0
        # a step without a save has no checkpoint phase (its bound comes from saves that were made)
        if must or self.storage.due(step):
            self.on_save(must)
            waited = self._agree_on_save_in_flight()
        blocked = waited + self.storage.save(step, state, force=must, sync=must, progress=progress)
        self.on_snapshot()
        snapshot_blocked = self.memory.snapshot(step, state)
        self._tell_interval(step)
        return blocked, snapshot_blocked

    def _agree_on_save_in_flight(self) -> float:
        """Collective, before a save: wait for the save in flight (the storage tier would, one at a time) and act on
        its outcome on every rank together. Its commit may have failed after this step's boundary agreement (a
        fenced commit, a full disk): rank 0 alone would raise inside the save while the others wait for it in the
        save's collectives. Returns the seconds waited."""
        t0 = time.perf_counter()
        self.storage.wait()
        failed = torch.tensor([self.storage.failure is not None], dtype=torch.int64)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.storage.group)
        if failed.item():
            self.act_on_failures(save_failed=True, snapshot_failed=False)
        return time.perf_counter() - t0

    @property
    def snapshot_interval(self) -> int:
        """The in-memory snapshot interval in effect (0: the tier is off)."""
        return self.memory.interval if self.memory.enabled else 0

    def _tell_interval(self, step: int) -> None:
        """What the memory tier chose (or found over budget) at this snapshot: one log line and one record each."""
        news, self.memory.news = self.memory.news, []
        for choice in news:
            self.say(choice.line())
            self.record("snapshot_interval", step=step, **choice.record())

    def local_failures(self) -> tuple[bool, bool]:
        """(this rank's last async save failed, this rank's last snapshot failed): agreed by the trainer with its
        other step-boundary flags in one collective, then acted on with :meth:`act_on_failures`."""
        return self.storage.failure is not None, self.memory.failed

    def act_on_failures(self, *, save_failed: bool, snapshot_failed: bool) -> None:
        """Every rank, with the agreed flags: a failed snapshot turns the memory tier off (storage continues); a
        failed save stops the run with its reason (exit 6) before more work is done that could not be saved."""
        if snapshot_failed and self.memory.enabled:
            self.memory.disable()
            self.say(
                "in-memory snapshots are off for this attempt (a rank's snapshot failed: see its warning); "
                "storage checkpoints continue"
            )
        if save_failed:
            self.storage.wait()
            try:
                self.storage.raise_failure()
                mine = None
            except Exception as e:  # noqa: BLE001 - raised below, once every rank knows rank 0's kind
                mine = e
            # rank 0's kind for every rank: a group the fence found replaced stops with one exit code (9)
            kind = [type(mine) if mine is not None else None]
            dist.broadcast_object_list(kind, src=0, group=self.storage.group)
            if mine is not None:
                raise mine
            raise (StaleGroup if kind[0] is StaleGroup else CheckpointStorageError)(
                "a peer's checkpoint write failed (see its log)"
            )

    def settle(self) -> None:
        """Every rank, at the same step boundary before a node leaves the group on purpose (a straggler taken
        out): wait for the in-memory snapshot and the storage save in flight, whose collectives need that node."""
        self.memory.wait()
        self.storage.wait()

    def hand_over_host_buffers(self) -> HostBuffers:
        """An in-place recovery, before :meth:`close_after_recovery`: both tiers' host buffers (page-locked on GPUs)
        for the next manager, which reuses what still fits (training.checkpoint.host_buffers); this one keeps none."""
        return self.host.hand_over()

    def close_after_recovery(self, wait_s: float, lost_ranks: frozenset[int] = frozenset()) -> None:
        """After an in-place recovery dropped the process group, and with it this manager's groups: wait up to
        ``wait_s`` for the snapshot in flight (the next manager's restore reads it; past that it is abandoned:
        :meth:`MemoryTier.close`; at once when its exchange is with one of ``lost_ranks``, the old group's ranks
        the recovery lost) and let both tiers go, keeping the snapshots. A storage save in flight is abandoned at once
        when the recovery lost a rank (its commit needs every rank of the old group), else waited for up to
        ``wait_s`` (a joiner let in: every old rank finishes it). The trainer then builds a manager for the new group
        and asks it to :meth:`restore`."""
        storage_wait_s = 0.0 if lost_ranks else wait_s
        self.close(discard_memory=False, memory_wait_s=wait_s, lost_ranks=lost_ranks, storage_wait_s=storage_wait_s)

    def close(
        self,
        *,
        discard_memory: bool,
        memory_wait_s: float | None = None,
        lost_ranks: frozenset[int] = frozenset(),
        storage_wait_s: float | None = None,
    ) -> None:
        """Wait for what is in flight; ``discard_memory`` (a finished or diverged run) removes the snapshots."""
        try:
            self.memory.close(discard=discard_memory, wait_s=memory_wait_s, lost_ranks=lost_ranks)
        finally:
            self.storage.close(storage_wait_s)
            self.fence.close()


def _skipped_words(skipped) -> str:
    """'; skipped as damaged: rank 1's own-node copy of step 7, ...' ('' when nothing was skipped)."""
    if not skipped:
        return ""
    names = [
        f"rank {d['rank']}'s {'own-node copy' if d['copy'] == 'own' else 'peer replica'} of step {d['step']}"
        for d in skipped
    ]
    return f"; skipped as damaged (CRC32C mismatch, moved to quarantine): {', '.join(names)}"

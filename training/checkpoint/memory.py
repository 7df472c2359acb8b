"""In-memory snapshots of the whole training state, every few steps, on the node and on a peer node.

A failure then costs at most the steps since the last snapshot (``checkpoint.memory_interval``: a number, or
``auto``, as often as ``checkpoint.memory_budget`` allows, see :mod:`training.checkpoint.snapshot_budget`), not a
checkpoint interval: after a snapshotted step's optimizer step every rank copies its shard of the training state
(model and optimizer shards, scheduler, progress with the data offset, its RNG) into node-local shared memory
that outlives the worker process (``/dev/shm``), and sends the same bytes to the rank with its local rank on the
next node (a ring), which keeps them in its own node's memory. A restarted worker restores from its node; a
replacement node's ranks get their shards from the peer that holds the replica; storage
(:mod:`training.checkpoint`) remains the tier of last resort.

Layout, per node: ``<memory dir>/<run key>/`` (0700), the run key a hash of the checkpoint directory, so a
snapshot is only ever offered to the run that wrote it. For saved rank ``s`` of world ``W``::

    own-r{s}-w{W}.{0,1}.data / .meta     two generations (double buffer)
    own-r{s}-w{W}.current                {"slot": k, "step": n}: written last, atomically
    peer-r{s}-w{W}.{0,1}.data / .meta    the replica this node keeps for rank s on the previous node
    peer-r{s}-w{W}.current

A process killed in the middle of a copy leaves ``.current`` pointing at the previous, complete generation.

The copy runs on a background thread while the next step's forward and backward run; the next optimizer
step waits for it (:meth:`MemoryTier.wait`), so the bytes are those of the step they are labelled with. It is
cut into large pieces that a few threads copy and checksum in parallel, without the GIL
(:mod:`training.checkpoint.snapshot_copy`); on GPUs the device-to-host part is queued on a side stream into
reused page-locked blocks (host memory, never a second copy on the GPU) with an event per piece, and each piece
waits for its own event, not the training stream. The replica goes out in chunks as their pieces land.

Every generation is checked: its CRC32C (the storage tier's checksum, :mod:`training.checkpoint.integrity`) is
computed piece by piece as the bytes are copied in and kept in its ``.meta``; a replica is checked again when
it arrives from the peer, and every generation that could be restored is checked before it is. A damaged one
is named in one line (which copy, rank, step, file, expected vs found CRC32C), moved aside to
``<run dir>/quarantine/`` (kept for inspection: the newest QUARANTINE_KEEP of each copy) and skipped: that
rank's shard then comes from its peer's replica, or from an older step every shard has intact, or the job
restores from storage.

A restart at another world size (a node lost from an elastic job, or one rejoining) re-cuts the snapshot:
FSDP2 splits every parameter and optimizer moment evenly on dim 0, so each new rank copies its rows out of the
old shards that overlap them (sent by whichever node holds them), with no full copy of the model anywhere.

    tier = MemoryTier.build(cfg.checkpoint, rank=0, world=2, local_world=1, ...)
    restored = tier.restore(state, storage_step=6)    # collective; None -> load from storage
    tier.snapshot(step, state); ...; tier.wait(); optimizer.step()
    tier.close(discard=True)                          # a finished run leaves no memory behind
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from training.checkpoint.restore_plan import restores_from_memory, same_world_sources, search_snapshots
from training.checkpoint.copy_plan import copy_threads, plan_pieces, replica_chunks
from training.checkpoint.fast_crc import crc32c_tensor
from training.checkpoint.snapshot_copy import (
    PIECE_BYTES,
    Copy,
    HostPieces,
    PieceCopier,
    Staged,
    copy_on_this_thread,
    spans,
)
from training.checkpoint.snapshot_budget import Choice, Pace
from training.config import DEFAULT_MEMORY_DIR, MEMORY_DIR_ENV

log = logging.getLogger("training")

ALIGN = 64
# Two generations of the own snapshot and two of the replica, with some slack: below this, the tier stays off.
HEADROOM = 1.25
STALE_S = 24 * 3600  # other runs' snapshot directories untouched this long are removed at start
# Every run directory the tier creates holds this file: only directories with it are ever swept as stale, so a
# memory_dir that is also home to anything else (a user's folder, /dev/shm itself, a checkpoint.dir) loses nothing.
OWNED = ".t5-failover-snapshots"
RUN_KEY_CHARS = 16  # run_key's hex digest length: the name of a run directory
QUARANTINE = "quarantine"  # damaged generations are moved here, in the run directory, for inspection
# The newest this many damaged generations of each copy are kept there: they are evidence, not an archive, and
# they live in the node's memory (a link that damaged every replica would otherwise fill it, a step at a time).
QUARANTINE_KEEP = 2
# A snapshot is copied and checksummed in pieces of this size (training.checkpoint.snapshot_copy): each piece is
# checksummed while it is still in the CPU's cache from the copy, instead of reading the snapshot a second time.
COPY_CHUNK = PIECE_BYTES
# The replica goes to the peer in chunks of this size, each as soon as its pieces are copied: the transfer
# overlaps the copy instead of starting after it, and a chunk is one large send (not one per piece).
REPLICA_CHUNK = 64 << 20
# An attempt's first snapshots pay one-time costs (the pages of both generations' buffers, and of the replica's,
# pinned host buffers on GPUs, the room check's collective): their cost is not what the next ones will cost.
WARMUP_SNAPSHOTS = 2
# A fixed memory_interval is judged against the budget once, on this many measured snapshots (averaged).
FIXED_JUDGED_AFTER = 3


#: Where a rank's restored state came from (:attr:`Restored.sources`): its own node's snapshot, a holder, or live.
SOURCES = ("own", "peer", "live")


@dataclass(frozen=True)
class Restored:
    step: int
    tier: str
    """'memory' (every rank from its own node) or 'peer' (some ranks from a peer node's replica)."""
    seconds: float
    resharded_from: int | None = None
    """The world size the snapshot was taken at, when it differs from now (the shards were re-cut)."""
    skipped: tuple[dict, ...] = ()
    """The damaged generations skipped on the way (see :meth:`MemoryTier.restore`)."""
    sources: tuple[str, ...] = ()
    """Where each rank's state came from, by rank: 'own' (its node's snapshot), 'peer' (some of it sent by a
    holder), 'live' (its state objects already held the step: a survivor of an in-place recovery, nothing read)."""


def run_key(checkpoint_dir: str) -> str:
    return hashlib.blake2b(os.path.realpath(checkpoint_dir).encode(), digest_size=8).hexdigest()


def memory_dir(configured: str) -> Path:
    """checkpoint.memory_dir, else $T5F_MEMORY_DIR (a simulated node's own directory), else /dev/shm."""
    return Path(configured or os.environ.get(MEMORY_DIR_ENV) or DEFAULT_MEMORY_DIR)


# ----------------------------------------------------------------------------- state <-> bytes
_TENSOR = "__t5f_tensor__"


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """A copy of the nested state with every tensor replaced by (_TENSOR, index); the local shards collected."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.to_local() if isinstance(obj, DTensor) else obj)
        return (_TENSOR, len(tensors) - 1)
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _join(skel: Any, template: Any, tensors: list[torch.Tensor]) -> Any:
    """Rebuild the nested state from a skeleton, wrapping shards as DTensors where the template has them."""
    if isinstance(skel, tuple) and len(skel) == 2 and skel[0] == _TENSOR:
        t = tensors[skel[1]]
        if isinstance(template, DTensor):
            if tuple(template.to_local().shape) != tuple(t.shape):
                raise ValueError(f"shard shape {tuple(t.shape)} != {tuple(template.to_local().shape)}")
            return DTensor.from_local(
                t.to(template.device),
                template.device_mesh,
                template.placements,
                run_check=False,
                shape=template.shape,
                stride=template.stride(),
            )
        if isinstance(template, torch.Tensor):
            return t.to(template.device)
        return t
    if isinstance(skel, dict):
        tm = template if isinstance(template, dict) else {}
        return {k: _join(v, tm.get(k), tensors) for k, v in skel.items()}
    if isinstance(skel, (list, tuple)):
        tm = template if isinstance(template, (list, tuple)) and len(template) == len(skel) else [None] * len(skel)
        return type(skel)(_join(v, t, tensors) for v, t in zip(skel, tm))
    return skel


class _Copied:
    """The snapshot's views, each copied off the mapped file as it is read (what a host restore keeps must not
    alias the snapshot, which the next snapshot overwrites)."""

    def __init__(self, views: list[torch.Tensor]):
        self.views = views

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.views[i].clone()


def _layout(tensors: list[torch.Tensor]) -> tuple[list[tuple[int, str, list[int]]], int]:
    out, off = [], 0
    for t in tensors:
        out.append((off, str(t.dtype).removeprefix("torch."), list(t.shape)))
        off += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return out, off


def _views(buf: torch.Tensor, layout: list[tuple[int, str, list[int]]]) -> list[torch.Tensor]:
    views = []
    for off, dtype, shape in layout:
        dt = getattr(torch, dtype)
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dt).element_size()
        views.append(buf[off : off + nbytes].view(dt).view(shape))
    return views


def _copy_checked(
    buf: torch.Tensor,
    layout: list[tuple[int, str, list[int]]],
    nbytes: int,
    tensors: list[torch.Tensor],
    before: Callable[[int], None] | None = None,
) -> str:
    """Copy the shards into their places in `buf` and return the CRC32C of ``buf[:nbytes]`` (alignment padding
    included), piece by piece right behind the copy, on this thread. `before(i)` runs before shard i is copied."""
    pieces = plan_pieces(spans(tensors, layout, on_host=True), nbytes, COPY_CHUNK)
    return copy_on_this_thread(buf, Staged(pieces, tensors), before)


def _damage(meta: dict, data: torch.Tensor, pool=None) -> tuple[str, str] | None:
    """(expected, found) CRC32C when `data` is not the bytes `meta` describes, else None; read in pieces on
    `pool`'s threads when given."""
    expected = meta.get("crc32c")
    found = crc32c_tensor(data[: meta["nbytes"]], pool)
    if expected == found:
        return None
    return (expected or "none (written without a checksum)", found)


def _to_bytes(obj: Any) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def _from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)  # plain containers and numbers only


#: Parsed .meta files by path, with the (inode, mtime, size) they were read at. A restore reads each generation's
#: meta three times (inventory, checks, fetch) and its weights-only unpickling is the slowest part of a restore
#: (~16 ms per read for the debug preset's skeleton: 0.23 of 0.37 s, profiled); a meta is never rewritten in place
#: (``_write_atomic`` replaces the file: a new inode), so an unchanged stat is unchanged content. Callers only read
#: the parsed meta (``_join`` builds new containers from its skeleton).
_META_CACHE: dict[Path, tuple[tuple[int, int, int], dict]] = {}


def _read_meta(path: Path) -> dict:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = _META_CACHE.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        meta = _from_bytes(f.read())
    _META_CACHE[path] = (key, meta)
    return meta


def _map(path: Path, size: int, create: bool) -> torch.Tensor:
    """The file as a shared uint8 tensor; `create` makes it `size` bytes with every block reserved up front.

    Reserved, not sparse: a store through a memory map into a block the file system cannot supply (a tmpfs that
    another process filled) is a SIGBUS that kills the process; posix_fallocate turns that into an ENOSPC here,
    before any byte is copied, which the tier reports and survives."""
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            os.posix_fallocate(fd, 0, max(size, 1))
        finally:
            os.close(fd)
    return torch.from_file(str(path), shared=True, size=max(size, 1), dtype=torch.uint8)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class _Generations:
    """Two generations of one rank's snapshot (own or replica) in a node directory.

    A slot is complete while its .meta exists: the meta is removed before the slot is overwritten and
    written after its data, so a copy cut short leaves the other slot (the previous step) complete.
    """

    def __init__(self, root: Path, prefix: str):
        self.root, self.prefix = root, prefix
        self.bufs: dict[int, torch.Tensor] = {}

    def path(self, suffix: str) -> Path:
        return self.root / f"{self.prefix}.{suffix}"

    def current(self) -> dict[str, int] | None:
        try:
            return json.loads(self.path("current").read_text())
        except (OSError, ValueError):
            return None

    def begin(self, size: int) -> tuple[int, torch.Tensor]:
        """The slot to write next (not the current one), invalidated, with its buffer of at least `size`."""
        cur = self.current()
        slot = 0 if cur is None else 1 - int(cur["slot"])
        self.path(f"{slot}.meta").unlink(missing_ok=True)
        buf = self.bufs.get(slot)
        if buf is None or buf.numel() < size:
            buf = self.bufs[slot] = _map(self.path(f"{slot}.data"), size, create=True)
        return slot, buf

    def publish(self, slot: int, step: int, meta: bytes) -> None:
        _write_atomic(self.path(f"{slot}.meta"), meta)
        _write_atomic(self.path("current"), json.dumps({"slot": slot, "step": step}).encode())

    def read(self, slot: int) -> tuple[int, dict, torch.Tensor] | None:
        """(step, meta, data) of a complete slot, or None."""
        try:
            meta = _read_meta(self.path(f"{slot}.meta"))
            data = _map(self.path(f"{slot}.data"), meta["nbytes"], create=False)
        except (OSError, RuntimeError, KeyError, ValueError, EOFError, TypeError):
            return None
        return meta["step"], meta, data

    def complete(self) -> list[tuple[int, dict, torch.Tensor]]:
        return [got for got in (self.read(0), self.read(1)) if got is not None]

    def find(self, step: int) -> tuple[int, dict, torch.Tensor] | None:
        return next((got for got in self.complete() if got[0] == step), None)

    def quarantine(self, slot: int, step: int, why: str) -> Path | None:
        """Move a damaged slot (data and meta) aside to <root>/quarantine/, with `why` next to it, and forget its
        buffer (the next write of this slot makes a new file). Returns where it went, None if it could not move."""
        dest = self.root / QUARANTINE / f"{self.prefix}.step{step:08d}.{time.time_ns()}"
        self.bufs.pop(slot, None)
        try:
            dest.mkdir(parents=True, mode=0o700)
            for suffix in ("data", "meta"):
                src = self.path(f"{slot}.{suffix}")
                if src.exists():
                    os.replace(src, dest / src.name)
            (dest / "DAMAGED.txt").write_text(why + "\n")
        except OSError:
            self.path(f"{slot}.meta").unlink(missing_ok=True)  # at least never offered again
            return None
        kept = sorted(dest.parent.glob(f"{self.prefix}.step*"), key=lambda d: d.name.rsplit(".", 1)[1].zfill(24))
        for old in kept[:-QUARANTINE_KEEP]:
            shutil.rmtree(old, ignore_errors=True)
        return dest

    def remove(self) -> None:
        self.bufs.clear()
        try:
            names = [p for p in self.root.glob(f"{self.prefix}.*")]
        except FileNotFoundError:  # another rank of this node emptied and removed the directory first
            return
        for p in names:
            p.unlink(missing_ok=True)


class MemoryTier:
    """The in-memory snapshot tier of one rank; every method with a collective is called by all ranks."""

    def __init__(
        self,
        *,
        interval: int | str,
        root: Path,
        rank: int,
        world: int,
        local_world: int,
        identity: dict[str, Any],
        replicate: bool,
        timeout_s: float,
        device: torch.device,
        budget: float = 0.02,
        max_interval: int = 10,
        mid_copy_hook: Callable[[int], None] | None = None,
        replica_hook: Callable[[int, torch.Tensor], None] | None = None,
        host_pieces: HostPieces | None = None,
    ):
        self.mid_copy_hook = mid_copy_hook  # fault injection: called halfway through a copy, with its step
        self.replica_hook = replica_hook  # fault injection: a received replica's (step, bytes), before its check
        self.rank, self.world, self.local_world = rank, world, local_world
        self.auto = interval == "auto"
        # the interval in effect: auto starts at every step (its first snapshots measure) and moves with the budget
        self.interval = 1 if self.auto else int(interval)
        self.enabled = self.interval > 0
        self.pace = Pace(budget=budget, max_interval=max_interval, fixed=None if self.auto else self.interval)
        self._next_due = 0  # auto: the next step to snapshot (the first step of an attempt is one)
        self._snapped = -1  # auto: the step of the last snapshot started
        self._taken = 0  # snapshots started in this attempt
        self._last: tuple[int, float, float, float] | None = None  # (step, end, waited_s, capture_s) of the last
        self.news: list[Choice] = []  # what the manager says and records: a new interval, a fixed one over budget
        self.root, self.identity, self.device = root, identity, device
        self.nodes = max(1, world // max(1, local_world))
        self.replicate = replicate and self.enabled and self.nodes > 1 and world % local_world == 0
        self.own = _Generations(root, f"own-r{rank}-w{world}")
        src = (rank - local_world) % world
        self.peer = _Generations(root, f"peer-r{src}-w{world}")
        self.dest, self.src = (rank + local_world) % world, src
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) if self.enabled else None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # set when close() gave up on the snapshot in flight (its exchange blocked on a peer that left the group):
        # that thread, if it ever gets through, publishes nothing into the directories the next tier uses
        self._abandoned = threading.Event()
        self._checked = False
        # the copy's threads (this rank's share of the node's cores), its reused page-locked pieces and side stream
        self.copier = PieceCopier(copy_threads(len(os.sched_getaffinity(0)), local_world), host=host_pieces)
        self.failed = False  # a snapshot of this rank failed; the trainer turns the tier off on every rank
        self.unusable: str | None = None  # why this node's memory directory cannot be used (set by build)
        self.waited_s = 0.0  # total time training waited for a copy to finish (before an optimizer step)
        self.restored: Restored | None = None
        self.skipped: list[dict] = []  # the damaged generations the last restore skipped (every rank's)
        # The rendezvous round of this worker group (training.checkpoint.generation; None: not on etcd), in every
        # snapshot's metadata; a replica of another round is refused, and a snapshot a replaced round wrote after a
        # later round restored (why, from stale(round, step); the manager sets it) is never offered.
        self.round: int | None = None
        self.stale: Callable[[int | None, int], str | None] = lambda rnd, step: None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        cfg,
        *,
        rank: int,
        world: int,
        local_world: int,
        checkpoint_dir: str,
        identity: dict[str, Any],
        device: torch.device,
        mid_copy_hook: Callable[[int], None] | None = None,
        host_pieces: HostPieces | None = None,
    ) -> "MemoryTier":
        """From the checkpoint config slice (memory_interval, memory_budget, interval, memory_dir, memory_replica,
        min_timeout_s); ``host_pieces``: the page-locked blocks a survivor of an in-place recovery kept."""
        root = memory_dir(cfg.memory_dir) / run_key(checkpoint_dir)
        unusable = None
        if cfg.memory_interval:  # auto or a number of steps
            try:
                _make_run_dir(root)
                if int(os.environ.get("LOCAL_RANK", "0")) == 0:
                    _remove_stale(root.parent, keep=root.name)
            except OSError as e:  # a file in the way, read-only, gone: the tier turns off (agreed at _check_room)
                unusable = f"{root.parent} cannot hold them ({type(e).__name__}: {e})"
        tier = cls(
            interval=cfg.memory_interval,
            root=root,
            rank=rank,
            world=world,
            local_world=local_world,
            identity=identity,
            replicate=cfg.memory_replica,
            timeout_s=cfg.min_timeout_s,
            device=device,
            budget=cfg.memory_budget,
            max_interval=cfg.interval,
            mid_copy_hook=mid_copy_hook,
            host_pieces=host_pieces,
        )
        tier.unusable = unusable
        return tier

    # ------------------------------------------------------------------ snapshots
    def due(self, step: int) -> bool:
        """Whether `step` is a snapshot step; still True for it once its snapshot started (the straggler watch asks
        after the snapshot whether the step has one to restart from)."""
        if self.auto:
            return self.enabled and (step >= self._next_due or step == self._snapped)
        return self.enabled and step % self.interval == 0

    def snapshot(self, step: int, state: dict[str, Any]) -> float:
        """Start the snapshot of `step` (collective on the first call: the memory check; with auto, on every one
        measured: the figures); returns the seconds the caller was blocked (capturing the state's structure,
        waiting for the previous copy)."""
        if not self.due(step) or step == self._snapped:
            return 0.0
        t0, waited0 = time.perf_counter(), self.waited_s
        self.wait()
        if not self.enabled:
            return time.perf_counter() - t0
        self._measure(step, t0, waited0)
        t1 = time.perf_counter()
        self._start(step, state)
        end = time.perf_counter()
        self._last = (step, end, self.waited_s, end - t1)
        self._next_due, self._snapped = step + self.interval, step
        return end - t0

    def _start(self, step: int, state: dict[str, Any]) -> None:
        """Capture the state's structure and start its copy on the snapshot thread."""
        tensors: list[torch.Tensor] = []
        skel = {k: _split(v.state_dict(), tensors) for k, v in state.items()}
        layout, nbytes = _layout(tensors)
        if not self._checked and not self._check_room(nbytes):
            return
        meta = {
            "step": step,
            "rank": self.rank,
            "world": self.world,
            "skeleton": skel,
            "layout": layout,
            "nbytes": nbytes,
            "identity": self.identity,
            "round": self.round,
        }  # its crc32c is added once the bytes are copied
        staged = self.copier.stage(tensors, layout, nbytes)
        self._thread = threading.Thread(
            target=self._write,
            args=(step, staged, nbytes, meta),
            name=f"memory-snapshot-{step}",
            daemon=True,
        )
        self._thread.start()

    def _measure(self, step: int, t0: float, waited0: float) -> None:
        """The previous snapshot's cost (capturing it, plus every wait for its copy up to now, this one's included)
        and the steps' time since it (their wall time less those waits), past the attempt's first snapshots; auto
        takes its interval from them, a fixed interval is judged against the budget once."""
        last, self._last = self._last, None
        self._taken += 1
        judged = WARMUP_SNAPSHOTS + 1 + FIXED_JUDGED_AFTER
        if last is None or self._taken <= WARMUP_SNAPSHOTS + 1 or (not self.auto and self._taken > judged):
            return
        prev_step, prev_end, prev_waited, capture_s = last
        cost_s = capture_s + self.waited_s - prev_waited
        step_s = (t0 - prev_end - (waited0 - prev_waited)) / max(1, step - prev_step)
        if not self.auto:  # measured on this rank alone until judged, then agreed once (the steps stay as set)
            self.pace.add(cost_s, step_s)
            if self._taken == judged:
                self.pace.cost_s, self.pace.step_s = self._agreed(self.pace.cost_s, self.pace.step_s)
                self.news += [c for c in [self.pace.judge_fixed()] if c is not None]
            return
        self.pace.add(*self._agreed(cost_s, step_s))
        chosen = self.pace.decide()
        if chosen is not None:
            self.interval = chosen.interval
            self.news.append(chosen)

    def _agreed(self, cost_s: float, step_s: float) -> tuple[float, float]:
        """Every rank's figures -> the largest of each, the same on every rank. Each rank measures its own
        cost, but the ranks must snapshot at the same steps: the replica ring and the room check are collectives
        a rank snapshotting alone would wait in until the timeout. The slowest rank's blocking holds the others
        at the next collective anyway, so its figure is the job's. One 16-byte all_reduce on the tier's gloo
        group, at a snapshot every rank takes (its previous copy joined: nothing else is on the group)."""
        figures = torch.tensor([cost_s, step_s], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=self.group)
        return float(figures[0]), float(figures[1])

    def _check_room(self, nbytes: int) -> bool:
        """All ranks agree the nodes have room for two generations (and a replica's two); else the tier is off."""
        self._checked = True
        need = nbytes * (4 if self.replicate else 2) * self.local_world * HEADROOM
        try:
            free = 0 if self.unusable else shutil.disk_usage(self.root).free
        except OSError as e:
            self.unusable, free = f"{self.root} cannot hold them ({type(e).__name__}: {e})", 0
        ok = torch.tensor([1 if free >= need else 0], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if not int(ok.item()):
            self.enabled = False
            if self.unusable:
                log.warning(
                    "WARNING: in-memory snapshots are off: %s; failures fall back to the storage checkpoints "
                    "(point --checkpoint.memory_dir at a writable node-local tmpfs)",
                    self.unusable,
                )
            elif free < need:
                log.warning(
                    "WARNING: in-memory snapshots are off: %s has %.0f MB free, the %d rank(s) of this node "
                    "need %.0f MB (two generations%s); failures fall back to the storage checkpoints",
                    self.root.parent,
                    free / 1e6,
                    self.local_world,
                    need / 1e6,
                    " and a peer's replica" if self.replicate else "",
                )
            elif self.rank == 0:
                log.warning(
                    "WARNING: in-memory snapshots are off: a node has too little free memory for them "
                    "(see its log); failures fall back to the storage checkpoints"
                )
        return self.enabled

    def _write(self, step: int, staged: Staged, nbytes: int, meta: dict) -> None:
        """The snapshot thread: the pieces run on the copier's pool; with a replica, each chunk is sent as soon as
        its pieces are copied; the generation is published once its CRC32C is known."""
        copy, buf, slot = None, None, -1
        hook = self.mid_copy_hook
        middle = len(staged.sources) // 2

        def before(i: int) -> None:
            if hook is not None and i == middle:
                hook(step)

        try:
            slot, buf = self.own.begin(nbytes)
            copy = self.copier.start(buf, staged, before)
        except Exception as e:  # noqa: BLE001 - reported by wait(); the peer exchange below still happens
            self._error = e

        published: list[bytes | None] = []  # publish() runs once: inside the ring exchange, or after it failed

        def publish() -> bytes | None:
            """This generation's meta, published; None when the copy failed (its error kept for wait())."""
            if published:
                return published[0]
            published.append(None)
            if copy is None or self._abandoned.is_set():
                return None
            try:
                published[0] = _to_bytes({**meta, "crc32c": copy.crc()})
                self.own.publish(slot, step, published[0])
            except Exception as e:  # noqa: BLE001 - reported by wait()
                self._error, published[0] = self._error or e, None
            return published[0]

        try:
            if self.replicate:  # even after a failed copy: the peers' threads wait for this exchange
                self._send_to_peer(copy, buf, nbytes, publish)
        except Exception as e:  # noqa: BLE001 - reported by wait() on the training thread
            self._error = self._error or e
        publish()  # a peer lost mid-exchange costs its replica, not this node's own copy of the step

    def _send_to_peer(
        self, copy: Copy | None, buf: torch.Tensor | None, nbytes: int, publish: Callable[[], bytes | None]
    ) -> None:
        """Ring exchange: our bytes to the next node's rank, the previous node's bytes into our replica.

        Every rank does the same exchanges in the same order (so none waits on a peer that waits on it): the
        sizes; the data in REPLICA_CHUNK chunks, all receives posted first, each send as soon as its pieces are
        copied; the meta's length; the meta. A side without a snapshot this step sends size -1 and no data; a
        side whose copy failed after the sizes sends its chunks anyway and meta length -1, and the receiver drops
        them. Every send and receive is non-blocking until the end, where all are waited for."""
        sizes = torch.tensor([nbytes if copy is not None else -1], dtype=torch.int64)
        theirs = torch.empty(1, dtype=torch.int64)
        _exchange(sizes, theirs, self.dest, self.src, self.group)
        n = int(theirs[0])
        reqs = []
        failed = None
        if n >= 0:
            try:
                slot, pbuf = self.peer.begin(n)
            except OSError as e:  # no room for the replica: take the bytes anyway (the sender waits for them)
                failed, slot, pbuf = e, -1, torch.empty(n, dtype=torch.uint8)
            reqs += [dist.irecv(pbuf[a:b], src=self.src, group=self.group) for a, b in replica_chunks(n, REPLICA_CHUNK)]
        if copy is not None and buf is not None:
            for a, b in replica_chunks(nbytes, REPLICA_CHUNK):
                copy.wait_through(b)
                reqs.append(dist.isend(buf[a:b], dst=self.dest, group=self.group))
        meta = publish()
        mine = torch.tensor([len(meta) if meta is not None else -1], dtype=torch.int64)
        their_len = torch.empty(1, dtype=torch.int64)
        _exchange(mine, their_len, self.dest, self.src, self.group)
        m = int(their_len[0]) if n >= 0 else -1
        if meta is not None:
            reqs.append(
                dist.isend(torch.frombuffer(bytearray(meta), dtype=torch.uint8), dst=self.dest, group=self.group)
            )
        if m >= 0:
            meta_in = torch.empty(m, dtype=torch.uint8)
            reqs.append(dist.irecv(meta_in, src=self.src, group=self.group))
        for r in reqs:
            r.wait()
        if failed is not None:
            raise failed
        if m >= 0:
            peer_meta = bytes(meta_in.numpy().tobytes())
            got = _from_bytes(peer_meta)
            if self.replica_hook is not None:
                self.replica_hook(int(got["step"]), pbuf[:n])
            damage = _damage(got, pbuf[:n], self.copier.pool)
            if got.get("round") != self.round:  # a group of another round wrote it: never offered
                log.warning(
                    "WARNING: refused the replica of rank %s's step %s: round %s, this group's is %s",
                    got.get("rank"),
                    got.get("step"),
                    got.get("round"),
                    self.round,
                )
            elif self._abandoned.is_set():
                return
            elif damage is None:
                self.peer.publish(slot, int(got["step"]), peer_meta)
            else:  # the previous generation stays the current one; this one is kept aside, never offered
                _write_atomic(self.peer.path(f"{slot}.meta"), peer_meta)  # quarantined with its data
                self._name_damaged(self.peer, slot, got, damage, "arrived damaged from the peer")

    def wait(self) -> None:
        """Until the snapshot in flight is written (before the optimizer changes the state it copies). A failure
        is reported once and sets `failed`; the tier stays in step with its peers until every rank agrees to
        turn it off (:meth:`disable`, at a step boundary)."""
        if self._thread is not None:
            t0 = time.perf_counter()
            self._thread.join()
            self.waited_s += time.perf_counter() - t0
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            if not self.failed:
                log.warning(
                    "WARNING: rank %d: in-memory snapshot failed (%s: %s); the tier turns off at the next "
                    "step, storage checkpoints continue",
                    self.rank,
                    type(e).__name__,
                    e,
                )
            self.failed = True

    def disable(self) -> None:
        """Every rank, at the same step boundary: no more snapshots in this attempt."""
        self.wait()
        self.enabled = False

    # ------------------------------------------------------------------ checks
    def _name_damaged(self, gens: _Generations, slot: int, meta: dict, damage: tuple[str, str], how: str) -> dict:
        """Say in one line which generation is damaged and how, move it aside, and return that as a record."""
        kind = gens.prefix.split("-r", 1)[0]
        file = gens.path(f"{slot}.data")
        record = {
            "copy": kind,
            "rank": int(meta["rank"]),
            "world": int(meta["world"]),
            "step": int(meta["step"]),
            "file": f"{socket.gethostname()}:{file}",
            "expected": damage[0],
            "found": damage[1],
        }
        what = (
            f"{'own-node copy' if kind == 'own' else 'peer replica'} of rank {record['rank']}'s shard of step "
            f"{record['step']} (world size {record['world']})"
        )
        dest = gens.quarantine(slot, record["step"], f"{what} {how}: CRC32C expected {damage[0]}, found {damage[1]}")
        log.warning(
            "WARNING: damaged memory snapshot (%s): the %s, %s: CRC32C expected %s, found %s; %s; skipped",
            how,
            what,
            record["file"],
            damage[0],
            damage[1],
            f"moved to {dest}" if dest else "could not be moved aside, its metadata removed",
        )
        return record

    def _check_mine(
        self, inventory: list[tuple[int, int, int, str]], floor: int, held: int | None = None
    ) -> list[dict]:
        """Verify the generations of this node that this rank answers for (its node's ranks split them by saved
        rank) and that could be restored (newer than ``floor``); the damaged ones are named, moved aside and
        returned. Not this rank's own copy of the step ``held`` live: only this rank would read it, and it will not."""
        damaged = []
        for s, w, step, kind in inventory:
            if step <= floor or s % self.local_world != self.rank % self.local_world:
                continue
            if (s, w, step, kind) == (self.rank, self.world, held, "own"):
                continue
            gens = _Generations(self.root, f"{kind}-r{s}-w{w}")
            for slot in (0, 1):
                got = gens.read(slot)
                if got is None or got[0] != step:
                    continue
                damage = _damage(got[1], got[2], self.copier.pool)
                if damage is not None:
                    damaged.append(self._name_damaged(gens, slot, got[1], damage, "found before restoring it"))
        return damaged

    # ------------------------------------------------------------------ restore
    def _inventory(self) -> list[tuple[int, int, int, str]]:
        """(saved rank, saved world, step, kind) of the usable snapshots in this node's directory."""
        found = set()
        for meta_file in sorted(self.root.glob("*.meta")):
            prefix = meta_file.name.rsplit(".", 2)[0]
            kind, _, rest = prefix.partition("-r")
            try:
                s, w = (int(x) for x in rest.split("-w"))
            except ValueError:
                continue
            for step, meta, _ in _Generations(self.root, prefix).complete():
                if meta.get("identity") == self.identity and meta.get("rank") == s and meta.get("world") == w:
                    why = self.stale(meta.get("round"), step)
                    if why is None:
                        found.add((s, w, step, kind))
                    elif self.rank % self.local_world == s % self.local_world:  # one line per snapshot
                        log.warning("WARNING: memory snapshot %s of step %d not used: %s", prefix, step, why)
        return sorted(found)

    def _held_by_some_rank(self, held: int | None) -> int | None:
        """Collective: the step the survivors of an in-place recovery hold live (they agreed on it), None when no
        rank holds one (a restart, or every rank re-cut to a new world)."""
        newest = torch.tensor([-1 if held is None else held], dtype=torch.int64)
        dist.all_reduce(newest, op=dist.ReduceOp.MAX, group=self.group)
        return None if int(newest) < 0 else int(newest)

    def restore(self, state: dict[str, Any], *, storage_step: int, held: int | None = None) -> Restored | None:
        """Collective. Load the newest step whose every shard is in some node's memory (own node or a peer's
        replica), if newer than `storage_step`, or that step when the survivors of an in-place recovery hold it
        (``held``); None means: load from storage. A snapshot taken at another world size is re-cut to this one
        (FSDP's even split on dim 0), with the shards it needs sent over.

        ``held``: the step ``state`` already holds at this rank and world size (a survivor of an in-place recovery
        whose shards did not move). When that step is chosen and this rank's own copy of it is on its node, nothing
        is read or checked for this rank (``mine`` 'live'); it still sends what its peers need, so every
        collective pairs up as in any restore."""
        if not self.enabled:
            return None
        t0 = time.perf_counter()
        mine = self._inventory()
        live_step = self._held_by_some_rank(held)
        # the storage step itself is a candidate when survivors hold it live: its generations are checked too
        floor = storage_step - 1 if live_step == storage_step else storage_step
        damaged = self._check_mine(mine, floor, held)
        node = f"{socket.gethostname()}:{self.root}"  # the ranks of one node list the same files
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, (node, mine, damaged), group=self.group)
        search = search_snapshots(gathered, world=self.world)
        self.skipped = search.skipped
        if not restores_from_memory(search, storage_step=storage_step, live_step=live_step):
            if self.rank == 0 and search.chosen is None and any(search.usable):
                why = (
                    "once the damaged copies are skipped"
                    if self.skipped
                    else "a snapshot was lost with its node and its replica"
                )
                log.info(
                    "memory snapshots: no step complete for every shard (world size %s; %s); restoring from storage",
                    ",".join(map(str, search.worlds)),
                    why,
                )
            return None
        step, world = search.chosen
        ok, tier = 1, "memory"
        try:
            if world == self.world:
                tier = self._restore_same_world(state, step, search.holders, live=step == held)
            else:
                tier = self._restore_resharded(state, step, world, search.holders, search.usable)
        except Exception as e:  # noqa: BLE001 - any rank failing sends every rank to storage
            log.warning(
                "WARNING: rank %d could not restore the memory snapshot of step %d (%s: %s); restoring from storage",
                self.rank,
                step,
                type(e).__name__,
                e,
            )
            ok = 0
        # every rank's outcome and source in one collective: any failure sends every rank to storage
        everyone = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world)]
        mine = torch.tensor([ok, SOURCES.index(tier if tier in SOURCES else "own")], dtype=torch.int64)
        dist.all_gather(everyone, mine, group=self.group)
        if not all(int(t[0]) for t in everyone):
            return None
        sources = tuple(SOURCES[int(t[1])] for t in everyone)
        self._forget_other_worlds()
        self.restored = Restored(
            step=step,
            tier="peer" if "peer" in sources else "memory",
            seconds=time.perf_counter() - t0,
            resharded_from=None if world == self.world else world,
            skipped=tuple(self.skipped),
            sources=sources,
        )
        return self.restored

    def _restore_same_world(self, state: dict[str, Any], step: int, holders, *, live: bool = False) -> str:
        """This rank's shard of ``step`` from its node or its holder; 'live' (nothing read) when ``live`` (the
        state already holds it) and its own node has it. Either way it sends the shards it holds for others."""
        plan = same_world_sources(holders, world=self.world, step=step)
        own = plan[self.rank] == (self.rank, "own")
        got = self._fetch(step, plan, read_own=not (live and own))
        if got is None:
            return "live"
        meta, data = got
        views = _views(data, meta["layout"])
        # On a GPU _join's .to(device) is the one copy; a clone first doubled the bytes moved and the host memory
        # (t5-large: 8.6 GB more per rank). On the host, state must not alias the mapped snapshot file.
        tensors = _Copied(views) if self.device.type == "cpu" else views
        for key, obj in state.items():
            skeleton = meta["skeleton"][key]
            if hasattr(obj, "load_local_shards"):  # the same layout: copied in once, no optimizer initialisation
                why = obj.load_local_shards(_join(skeleton, None, views))
                if not why:
                    continue
                log.info("memory snapshot of step %d: %s is loaded the general way (%s)", step, key, why)
            obj.load_state_dict(_join(skeleton, obj.state_dict(), tensors))
        return "memory" if own else "peer"

    def _restore_resharded(self, state: dict[str, Any], step: int, old_world: int, holders, everyone) -> str:
        """Re-cut the `old_world` shards of `step` to this world: every rank gets the old shards its new rows
        overlap (and its own old rank's, for its RNG) from its node or from a holder, then copies the rows."""
        templates = {k: v.state_dict() for k, v in state.items()}
        rows = sorted({int(t.shape[0]) for t in _dtensors(templates)})
        need = [_old_shards_needed(r, self.world, old_world, rows) for r in range(self.world)]
        local = {s for s, w, st, _ in everyone[self.rank] if (w, st) == (old_world, step)}
        got: dict[int, tuple[dict, list[torch.Tensor]]] = {}
        from_peer = False  # some of this rank's rows come from a replica or another node
        for s in sorted(need[self.rank] & local):
            kind = "own" if (s, old_world, step, "own") in everyone[self.rank] else "peer"
            g = _Generations(self.root, f"{kind}-r{s}-w{old_world}").find(step)
            got[s] = (g[1], _views(g[2], g[1]["layout"]))
            from_peer |= kind == "peer"
        for s in range(old_world):  # the same order on every rank: blocking sends cannot deadlock
            holder, kind = holders[(old_world, step, s)][0]
            for r in range(self.world):
                has = any(x[:3] == (s, old_world, step) for x in everyone[r])
                if s not in need[r] or has or self.rank not in (holder, r):
                    continue
                if self.rank == holder:
                    g = _Generations(self.root, f"{kind}-r{s}-w{old_world}").find(step)
                    _send_blob(_to_bytes(g[1]), g[2][: g[1]["nbytes"]], r, self.group)
                else:
                    meta, data = _recv_blob(holder, self.group, self.copier.pool)
                    got[s] = (meta, _views(data, meta["layout"]))
                    from_peer = True
        for key, obj in state.items():
            src = next((s for s in sorted(got) if key in got[s][0]["skeleton"]), None)
            if src is None:  # a rank the old world did not have: its RNG starts fresh, as from storage
                continue
            obj.load_state_dict(
                _recut(got[src][0]["skeleton"][key], templates[key], got, src, self.rank, self.world, old_world)
            )
        return "peer" if from_peer else "memory"

    def _forget_other_worlds(self) -> None:
        """Once restored (every rank is past the agreement): snapshots of other world sizes are dead weight."""
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return
        for p in self.root.glob("*-w*.*"):
            w = p.name.split("-w", 1)[1].split(".", 1)[0]
            if w.isdigit() and int(w) != self.world:
                p.unlink(missing_ok=True)

    def _fetch(
        self, step: int, plan: dict[int, tuple[int, str]], read_own: bool = True
    ) -> tuple[dict, torch.Tensor] | None:
        """This rank's snapshot bytes: from this node's directory, or sent by the rank whose node holds them;
        None when its own node holds them and ``read_own`` is False (what it holds for others is still sent)."""
        mine = None
        for s in range(self.world):
            holder, kind = plan[s]
            if holder == s and s == self.rank:
                if read_own:
                    got = _Generations(self.root, f"{kind}-r{s}-w{self.world}").find(step)
                    mine = (got[1], got[2])
            elif holder != s and self.rank in (holder, s):
                if self.rank == holder:
                    got = _Generations(self.root, f"{kind}-r{s}-w{self.world}").find(step)
                    _send_blob(_to_bytes(got[1]), got[2][: got[1]["nbytes"]], s, self.group)
                else:
                    mine = _recv_blob(holder, self.group, self.copier.pool)
        if plan[self.rank] == (self.rank, "own") and not read_own:
            return None
        if mine is None or mine[0]["step"] != step:
            raise RuntimeError(f"snapshot of step {step} for rank {self.rank} not found")
        return mine

    # ------------------------------------------------------------------ end
    def close(self, *, discard: bool, wait_s: float | None = None, lost_ranks: frozenset[int] = frozenset()) -> None:
        """Wait for the copy in flight; `discard` (a finished run, or a diverged one) removes its snapshots; a
        failed run keeps them for its restart. ``wait_s`` bounds the wait (an in-place recovery: the group went,
        and the ring exchange may be blocked on a surviving peer that left it before its own exchange began; gloo
        cannot cut it, and its peers' new group would wait on this rank for its collective timeout): past it the
        snapshot is abandoned, said in one line, and never published. ``lost_ranks``: the ranks the recovery lost;
        a snapshot whose ring exchange is with one of them cannot complete: abandoned at once."""
        if wait_s is not None and self._thread is not None:
            partner = sorted({self.dest, self.src} & set(lost_ranks)) if self.replicate else []
            self._thread.join(0 if partner else wait_s)
            if self._thread.is_alive():
                self._abandoned.set()
                why = (
                    f"its ring exchange is with rank {partner[0]}, which the recovery lost"
                    if partner
                    else f"it did not finish within {wait_s:.3g} s of the recovery (its exchange with the peer node "
                    "is blocked on the old group)"
                )
                log.warning(
                    "WARNING: rank %d: the in-memory snapshot in flight was abandoned: %s; the restore uses an older "
                    "snapshot (its thread was at: %s)",
                    self.rank,
                    why,
                    _where(self._thread),
                )
                self._thread = None  # its pool stays: the abandoned thread may still use it
                return
        self.wait()
        self.copier.close()
        if discard and self.root.exists():
            self.own.remove()
            self.peer.remove()
            try:  # the last rank of the node to finish: nothing but the marker is left
                if {p.name for p in self.root.iterdir()} == {OWNED}:
                    (self.root / OWNED).unlink(missing_ok=True)
                    self.root.rmdir()
            except OSError:
                pass


def _where(thread: threading.Thread, frames: int = 4) -> str:
    """Where ``thread`` is now, innermost first (``function file:line``): the line that says a snapshot was
    abandoned names what it was blocked on."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    out = []
    while frame is not None and len(out) < frames:
        out.append(f"{frame.f_code.co_name} {Path(frame.f_code.co_filename).name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(out) or "not running"


def _exchange(send: torch.Tensor, recv: torch.Tensor, dst: int, src: int, group) -> None:
    reqs = [dist.isend(send.contiguous(), dst=dst, group=group), dist.irecv(recv, src=src, group=group)]
    for r in reqs:
        r.wait()


def _make_run_dir(root: Path) -> None:
    """The run's snapshot directory (0700), marked as the tier's own (OWNED) before anything else goes in."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (root / OWNED).is_file():
        _write_atomic(root / OWNED, json.dumps({"created": time.time(), "by": "t5-failover memory tier"}).encode())


def is_run_dir(d: Path) -> bool:
    """A snapshot directory the tier made: named like a run key and holding the OWNED marker."""
    name = d.name
    return (
        len(name) == RUN_KEY_CHARS
        and all(c in "0123456789abcdef" for c in name)
        and d.is_dir()
        and not d.is_symlink()
        and (d / OWNED).is_file()
    )


def _remove_stale(parent: Path, keep: str) -> None:
    """Snapshot directories of other runs on this node, untouched for STALE_S (abandoned jobs). Only the tier's
    own directories (is_run_dir) are candidates: nothing else in the memory directory is ever removed."""
    now = time.time()
    for d in parent.iterdir() if parent.is_dir() else []:
        try:
            if d.name != keep and is_run_dir(d) and now - max(p.stat().st_mtime for p in [d, *d.iterdir()]) > STALE_S:
                shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _send_blob(meta: bytes, data: torch.Tensor, dst: int, group) -> None:
    meta_t = torch.frombuffer(bytearray(meta), dtype=torch.uint8)
    dist.send(torch.tensor([meta_t.numel(), data.numel()], dtype=torch.int64), dst=dst, group=group)
    dist.send(meta_t, dst=dst, group=group)
    dist.send(data.contiguous(), dst=dst, group=group)


def _recv_blob(src: int, group, pool=None) -> tuple[dict, torch.Tensor]:
    sizes = torch.empty(2, dtype=torch.int64)
    dist.recv(sizes, src=src, group=group)
    meta = torch.empty(int(sizes[0]), dtype=torch.uint8)
    dist.recv(meta, src=src, group=group)
    data = torch.empty(int(sizes[1]), dtype=torch.uint8)
    dist.recv(data, src=src, group=group)
    got = _from_bytes(meta.numpy().tobytes())
    damage = _damage(got, data, pool)
    if damage is not None:  # checked by its holder before it was sent: the transfer damaged it
        raise ValueError(
            f"the snapshot of rank {got['rank']}'s shard of step {got['step']} sent by rank {src} "
            f"arrived damaged (CRC32C expected {damage[0]}, found {damage[1]})"
        )
    return got, data


# ----------------------------------------------------------------------------- re-cutting shards
def _dtensors(obj: Any):
    if isinstance(obj, DTensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _dtensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _dtensors(v)


def _rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """(first row, row count) of `rank`'s dim-0 shard of an `n`-row tensor split over `world` (FSDP2, DTensor)."""
    size, offset = Shard.local_shard_size_and_offset(n, world, rank)
    return int(offset), int(size)


def _old_shards_needed(rank: int, world: int, old_world: int, row_counts: list[int]) -> set[int]:
    """The old ranks whose rows `rank` needs for any tensor; its own old rank too (its RNG), and at least one."""
    need = {rank} if rank < old_world else set()
    for n in row_counts:
        lo, cnt = _rows(n, world, rank)
        for s in range(old_world):
            o, c = _rows(n, old_world, s)
            if cnt and c and o < lo + cnt and lo < o + c:
                need.add(s)
    return need or {0}


def _recut(
    skel: Any,
    template: Any,
    got: dict[int, tuple[dict, list[torch.Tensor]]],
    src: int,
    rank: int,
    world: int,
    old_world: int,
) -> Any:
    """Like _join, but each DTensor leaf is assembled from the old shards' rows that fall in this rank's shard;
    every other leaf is old shard `src`'s (whose skeleton `skel` is)."""
    if isinstance(skel, tuple) and len(skel) == 2 and skel[0] == _TENSOR:
        i = skel[1]
        if isinstance(template, DTensor):
            if template.device_mesh.ndim != 1 or tuple(template.placements) != (Shard(0),):
                raise ValueError(f"re-cutting supports FSDP's 1-D Shard(0) layout only, not {template.placements}")
            n = int(template.shape[0])
            lo, cnt = _rows(n, world, rank)
            out = torch.empty((cnt, *template.shape[1:]), dtype=template.dtype)
            filled = 0
            for s, (_, tensors) in got.items():
                o, c = _rows(n, old_world, s)
                a, b = max(o, lo), min(o + c, lo + cnt)
                if a < b:
                    src = tensors[i]
                    if src.dtype != template.dtype or tuple(src.shape) != (c, *template.shape[1:]):
                        raise ValueError(
                            f"old shard {s} holds {tuple(src.shape)} {src.dtype}, expected "
                            f"{(c, *template.shape[1:])} {template.dtype}"
                        )
                    out[a - lo : b - lo].copy_(src[a - o : b - o])
                    filled += b - a
            if filled != cnt:
                raise ValueError(f"only {filled} of {cnt} rows of a {tuple(template.shape)} tensor were found")
            return DTensor.from_local(
                out.to(template.device),
                template.device_mesh,
                template.placements,
                run_check=False,
                shape=template.shape,
                stride=template.stride(),
            )
        ref = got[src][1][i]
        return ref.clone().to(template.device) if isinstance(template, torch.Tensor) else ref.clone()
    if isinstance(skel, dict):
        tm = template if isinstance(template, dict) else {}
        return {k: _recut(v, tm.get(k), got, src, rank, world, old_world) for k, v in skel.items()}
    if isinstance(skel, (list, tuple)):
        tm = template if isinstance(template, (list, tuple)) and len(template) == len(skel) else [None] * len(skel)
        return type(skel)(_recut(v, t, got, src, rank, world, old_world) for v, t in zip(skel, tm))
    return skel

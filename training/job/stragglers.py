"""Stragglers: a rank that is persistently slower than the others is named, and with a hot spare waiting its node
leaves the job at a step boundary after the step's in-memory snapshot, so the spare takes its place and nothing is
recomputed.

What is timed. With FSDP2 the collectives sit inside the forward and the backward pass (each block's parameters
are all-gathered before it runs, its gradients reduce-scattered after), so a step's wall time is the same on every
rank: the fast ones wait for the slow one. What differs is the time a rank spends on its *own* work. Each rank
sums, per step, the time between FSDP's pre-forward hook (which has waited for the block's all-gather) and the
block's output, over the model's FSDP blocks (:class:`WorkClock`, public module hooks registered after
``fully_shard``, so they run after FSDP's own), plus its optimizer step (AdamW on its own shards, no collective;
the optimizer's public step hooks). That is its compute without the waits for peers: a rank slowed by a throttled
device, a noisy neighbour or a stop/continue cycle reads 2-4x, its peers do not. CPU time
(``time.thread_time``) was rejected: a process that is stopped or starved of a core uses no CPU time, so the
common slow-node causes would not show. On a GPU the same hooks record CUDA events on the compute stream, read at
the step's end.

How ranks compare. One all-gather of five numbers per rank each step (work time, node, spares waiting, restarts
left, eviction window open): every rank then holds the same table and takes the same decision at the same step
boundary, which a store read at each rank's own moment would not give (and a decision that differs between ranks
would leave some ranks at the next step's collectives). Cost: one small gloo collective, ~3 ms per step here
(median, waiting for the last rank included).

The rule (:class:`StragglerRule`): rank r is slow in a step when its work time is at least ``straggler.factor`` x
the median of the *other* ranks' (the others' median: with two ranks the median of all would include the straggler
itself); it is named in a slow step once ``straggler.steps`` (M) of its last 2M-1 steps were slow. A slowdown
that hits every rank (a slow storage write, a long batch) raises the median with it: nobody is named. What happens then
(:class:`StragglerWatch`):

* a ``straggler`` event in metrics.jsonl and one line naming the rank, its node and host, its time vs the others'
  median and for how many steps (once per episode);
* with a hot spare waiting (the agent's note, :mod:`training.job.agent_notes`), a restart left on every rank, the
  eviction window open (at most one node taken out per ``straggler.evict_window_s``, kept across restarts) and
  the step's in-memory snapshot taken: every rank waits for the step's checkpoint writes in flight, then stops at
  this step boundary (:class:`~training.errors.Regroup`, exit code 8); the straggler's node's workers first leave
  the take-out note, so its agent leaves the job instead of joining the next round, where the spare takes its
  place. With ``failover.in_place`` only the straggler's node's workers stop: the others' stop is a
  :class:`~training.errors.PeerTakenOut` that the in-place failover catches, and they recover in place (their
  processes, ranks and live state kept) while the spare's workers join in the straggler's ranks, as after a lost
  node (docs/inprocess.md). Otherwise the job keeps its size and trains on.

``straggler.factor`` 0 or one rank: :meth:`StragglerWatch.build` returns a watch that does nothing.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
from collections import deque
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from training.errors import PeerTakenOut, Regroup
from training.job.agent_notes import request_take_out, spares_waiting

#: Where the time of the last node taken out is kept (the eviction window outlives the attempt).
TAKEN_OUT_FILE = ".straggler-taken-out"


class WorkClock:
    """Sums this rank's own work per step: the forward compute of the model's FSDP blocks (the all-gather waits
    excluded; see the module docstring) and the optimizer step (local: AdamW on this rank's shards). ``take()``
    returns the seconds since the last ``take()`` and starts over."""

    def __init__(self, model: torch.nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None):
        from torch.distributed.fsdp import FSDPModule

        self.cuda = device.type == "cuda"
        self.blocks = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
        self._total, self._t0 = 0.0, 0.0
        # Hooks may nest (an optimizer subclass whose step() calls its parent's, both wrapped by torch's step
        # hooks): only the outermost enter/leave pair times, or the inner enter would restart the clock.
        self._depth = 0
        self._events: list[list[torch.cuda.Event]] = []
        for block in self.blocks:
            # registered after fully_shard: they run after FSDP's pre-forward hook (the all-gather waited for)
            block.register_forward_pre_hook(lambda *_: self._enter())
            block.register_forward_hook(lambda *_: self._leave())
        if optimizer is not None:
            optimizer.register_step_pre_hook(lambda *_: self._enter())
            optimizer.register_step_post_hook(lambda *_: self._leave())

    def _enter(self) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events.append([start])
        else:
            self._t0 = time.perf_counter()

    def _leave(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth > 0:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[-1].append(end)
        else:
            self._total += time.perf_counter() - self._t0

    def take(self) -> float:
        if self.cuda and self._events:
            self._events[-1][-1].synchronize()
            self._total = sum(a.elapsed_time(b) for a, b in self._events) / 1000.0
            self._events.clear()
        total, self._total = self._total, 0.0
        return total


@dataclass(frozen=True)
class Straggler:
    """A rank named slow: its work time and the others' median in the last step, and its slow steps among the last
    2M-1."""

    rank: int
    work_s: float
    median_s: float
    steps: int

    @property
    def ratio(self) -> float:
        return self.work_s / self.median_s if self.median_s > 0 else float("inf")


class StragglerRule:
    """k x the others' median in M of the last 2M-1 steps, the latest step among them (see the module docstring);
    pure, so it is tested alone.

    Why not M consecutive steps: a rank that is slowed part of the time (stopped 0.2 s of every 0.3 s, a throttled
    device) reads below k in some of its steps, because only its own forward and optimizer work is timed and a stop
    that lands in its backward pass or in a wait for a peer does not show. Measured on the chaos straggler: 3 to 8
    slowed steps passed before three in a row read >= 2x (detection 7-24 s). A single slow step (a page fault burst,
    another process on the core) still names nobody for M >= 2."""

    def __init__(self, factor: float, steps: int):
        self.factor, self.steps = factor, steps
        self.recent: dict[int, deque[bool]] = {}

    def observe(self, times: list[float]) -> Straggler | None:
        """One step's work times by rank; the slowest rank slow in this step and in M of the last 2M-1, or None."""
        named = []
        for rank, t in enumerate(times):
            others = times[:rank] + times[rank + 1 :]
            median = statistics.median(others) if others else 0.0
            slow = median > 0 and t >= self.factor * median
            recent = self.recent.setdefault(rank, deque(maxlen=2 * self.steps - 1))
            recent.append(slow)
            if slow and sum(recent) >= self.steps:
                named.append(Straggler(rank, t, median, sum(recent)))
        return max(named, key=lambda s: s.ratio, default=None)


@dataclass(frozen=True)
class Row:
    """What one rank contributes to the step's all-gather."""

    work_s: float
    node: float
    spares: float  # hot spares its agent says wait (agent_notes)
    restarts_left: float
    window_open: float  # 1: no node taken out within straggler.evict_window_s (its view of the file)


def decide(rows: list[Row], *, step: int, snapshot_due: bool, last_step: int, window_s: float) -> tuple[bool, str]:
    """(take the straggler's node out now, the action in words) from the gathered rows, the same on every rank:
    only with a spare waiting (any agent's view), a restart left on every node (else the job would end instead of
    re-forming), the eviction window open (rank 0's view), this step's in-memory snapshot taken (what the group
    restarts from: nothing recomputed) and a step still to train."""
    if not max(r.spares for r in rows):
        return False, "no hot spare waits: the job keeps its size"
    if min(r.restarts_left for r in rows) <= 0:
        return False, "a node has no restart left: the job keeps its size"
    if not rows[0].window_open:
        return False, (
            "straggler.evict_window_s is 0: stragglers are named, never taken out"
            if window_s <= 0
            else f"a node was taken out less than straggler.evict_window_s {window_s:g} s ago: the job keeps its size"
        )
    if step >= last_step:
        return False, "the last step is done: nothing to gain from a spare"
    if not snapshot_due:
        return False, "waiting for a step with an in-memory snapshot to take its node out"
    return True, f"taking its node out after the in-memory snapshot of step {step}: a hot spare takes its place"


def window_opens_at(window_file: Path, window_s: float) -> float:
    """When the eviction window opens (a time.time() value): ``window_s`` after the last take-out recorded in
    ``window_file``; at once without one; never when ``window_s`` <= 0 (stragglers are named, never taken out)."""
    if window_s <= 0:
        return math.inf
    try:
        last = float(window_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0.0
    return last + window_s


class NoStragglerWatch:
    """The watch when detection is off (``straggler.factor`` 0) or there is nobody to compare with."""

    enabled = False

    def after_step(self, step: int) -> None:
        pass


class StragglerWatch:
    """Times this rank's work each step, compares the ranks, names a straggler and takes its node out when a
    spare waits. Call :meth:`after_step` on every rank at each step boundary, after the step's snapshot started:

        watch = StragglerWatch.build(cfg, model=model, ...)   # after fully_shard
        ...
        watch.after_step(step)      # may raise Regroup (the straggler's node: close, exit 8) or PeerTakenOut
                                    # (the others: a Regroup too, or an in-place job's recovery)
    """

    enabled = True

    def __init__(
        self,
        cfg,
        *,
        clock: WorkClock,
        rank: int,
        world: int,
        out_dir: str,
        snapshot_due: Callable[[int], bool],
        settle: Callable[[], None],
        metrics,
        restarts_left: int,
        last_step: int,
    ):
        self.cfg, self.clock, self.rank, self.world = cfg, clock, rank, world
        self.rule = StragglerRule(cfg.factor, cfg.steps)
        self.snapshot_due, self.settle, self.metrics = snapshot_due, settle, metrics
        self.node = int(os.environ.get("GROUP_RANK", "0"))  # the torchrun agent (node) this worker belongs to
        self.hosts = [""] * world
        dist.all_gather_object(self.hosts, socket.gethostname())  # once: the line names the straggler's host
        self.window_file = Path(out_dir) / TAKEN_OUT_FILE
        self.restarts_left = restarts_left
        self.last_step = last_step  # nothing to gain from re-forming after the last step
        self._seen = 0
        # read once (the file changes only with a take-out, which ends the attempt); the window itself opens with
        # time, inside this attempt: an attempt starts right after the take-out that restarted it
        self.window_opens_at = window_opens_at(self.window_file, cfg.evict_window_s)
        self._named: int | None = None  # the rank named in the current episode (said once)

    @classmethod
    def build(
        cls,
        cfg,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        rank: int,
        world: int,
        out_dir: str,
        snapshot_due: Callable[[int], bool],
        settle: Callable[[], None],
        metrics,
        last_step: int,
    ) -> "StragglerWatch | NoStragglerWatch":
        """From the straggler config slice; call after ``fully_shard`` (the hooks go on the FSDP blocks).
        ``settle``: waits for the checkpoint writes in flight (the manager's :meth:`settle`)."""
        if cfg.factor <= 0 or world < 2 or not dist.is_initialized():
            return NoStragglerWatch()
        # torchrun tells its workers how many restarts the agent has left; a take-out needs one on every node
        # (the group restarts without the straggler), else the job would end instead of re-forming
        env = os.environ
        left = int(env.get("TORCHELASTIC_MAX_RESTARTS", 0)) - int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
        return cls(
            cfg,
            clock=WorkClock(model, device, optimizer),
            rank=rank,
            world=world,
            out_dir=out_dir,
            snapshot_due=snapshot_due,
            settle=settle,
            metrics=metrics,
            restarts_left=left,
            last_step=last_step,
        )

    def after_step(self, step: int) -> None:
        own = self.clock.take()
        window_open = float(time.time() >= self.window_opens_at)
        row = torch.tensor([own, self.node, spares_waiting(), self.restarts_left, window_open], dtype=torch.float64)
        table = [torch.empty_like(row) for _ in range(self.world)]
        dist.all_gather(table, row)
        self._seen += 1
        if self._seen <= self.cfg.skip_steps:
            return
        found = self.rule.observe([t[0].item() for t in table])
        if found is None:
            self._named = None  # the episode is over (or none began)
            return
        node = int(table[found.rank][1].item())
        take_out, action = decide(
            [Row(*t.tolist()) for t in table],
            step=step,
            snapshot_due=self.snapshot_due(step),
            last_step=self.last_step,
            window_s=self.cfg.evict_window_s,
        )
        if self._named != found.rank or take_out:
            self._say(found, node, step, action)
            self._named = found.rank
        if take_out:
            self._leave(found, node, step)

    def _say(self, s: Straggler, node: int, step: int, action: str) -> None:
        line = (
            f"[straggler] rank {s.rank} (node {node}, host {self.hosts[s.rank]}) worked {s.work_s:.3f} s in step "
            f"{step} vs the others' "
            f"median {s.median_s:.3f} s (x{s.ratio:.1f}), {s.steps} slow of its last {2 * self.cfg.steps - 1} "
            f"step(s) (straggler.factor "
            f"{self.cfg.factor:g}, straggler.steps {self.cfg.steps}); {action}"
        )
        self.metrics.info(line)
        self.metrics.event(
            "straggler",
            step=step,
            rank=s.rank,
            node=node,
            host=self.hosts[s.rank],
            work_s=round(s.work_s, 4),
            median_s=round(s.median_s, 4),
            ratio=round(s.ratio, 2),
            slow_steps=s.steps,
            action=action,
        )

    def _leave(self, s: Straggler, node: int, step: int) -> None:
        """Every rank: wait for what this step's checkpointing has in flight (the straggler's node must not leave
        its peers' collectives half done), then stop at this boundary: the straggler's node's workers leave the
        take-out note and raise Regroup (their agent leaves the job), the others PeerTakenOut (a Regroup, unless
        the job recovers in place)."""
        reason = (
            f"rank {s.rank} (node {node}, host {self.hosts[s.rank]}) is a straggler: "
            f"x{s.ratio:.1f} the others' median work time for {s.steps} steps; taken out after step {step}"
        )
        if self.rank == 0:
            self.window_file.parent.mkdir(parents=True, exist_ok=True)
            self.window_file.write_text(f"{time.time():.3f}\n")
        self.settle()
        if node == self.node:
            request_take_out(reason)
            raise Regroup(reason)
        raise PeerTakenOut(reason)

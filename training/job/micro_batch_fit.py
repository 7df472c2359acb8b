"""Which ``train.micro_batch`` a job takes (issue 51, lever 5): the largest that fits the GPU by measured memory,
within the failover rule. Pure arithmetic; the measuring is training.batch_fit's (on a GPU).

**Memory.** A rank's peak for one step whose forward/backward takes m samples is close to a line,
``fixed + per_sample x m``: the weights, gradients, optimizer state and buffers, then the activations, which grow
with the samples. The line is fitted (least squares) to peaks measured at two or three small micro-batches; the
largest m whose predicted peak stays within ``(1 - headroom)`` of the GPU is what fits. The headroom covers what the
allocated peak leaves out: the allocator's reserve above it, a world > 1's communication buffers, and the line's
drift when extrapolated.

**The failover rule.** The job's planned worlds are ``n x nproc_per_node`` for n from the launcher's MIN nodes
(``--min-nodes``, ``T5_MIN_NODES``, the MIN of ``--nnodes MIN:MAX``) to its MAX (``--nodes``). ``train.global_batch``
is fixed, so a rank's share ``global_batch / world`` is smallest at the largest world and grows as nodes are lost.
The micro-batch chosen divides the share at EVERY planned world (config.check_world already needs the global batch
to divide by each world): every world then runs whole micro-batches of exactly that size, so a job that loses
nodes accumulates more micro-batches and never runs a larger one. Its activations take what they took at full
size; only its shard of the state grows (state / MIN world), and a fit measured at world 1 already holds that state
whole. Hence the choice is never above the share at the largest world (and so never above the smallest world's);
a GPU with room for more is said so, with the fix: a larger ``train.global_batch`` (which changes the optimisation,
so it is the user's call, not this rule's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


class FitError(ValueError):
    """A value the fit cannot use. The message names the value and the fix."""


@dataclass(frozen=True)
class MemoryLine:
    """A rank's peak memory against the samples one forward/backward takes: ``fixed_gb + per_sample_gb x m``."""

    fixed_gb: float
    """The peak at no samples: weights, gradients, optimizer state and buffers of the measured world."""
    per_sample_gb: float
    """What one more sample in the micro-batch adds to the peak (its activations)."""

    def peak_gb(self, micro_batch: int) -> float:
        """The predicted peak for ``micro_batch`` samples per forward/backward."""
        return self.fixed_gb + self.per_sample_gb * micro_batch

    def largest_fitting(self, capacity_gb: float, headroom: float) -> int:
        """The most samples whose predicted peak stays within ``(1 - headroom) x capacity_gb`` (0: not even one)."""
        if not capacity_gb > 0:
            raise FitError(f"GPU capacity {capacity_gb} GB must be > 0: pass the GPU's memory in GB")
        if not 0 <= headroom < 1:
            raise FitError(f"headroom {headroom} must be in [0, 1) (a share of the GPU kept free): e.g. --headroom 0.1")
        usable = capacity_gb * (1 - headroom) - self.fixed_gb
        return max(0, math.floor(usable / self.per_sample_gb))


def fit_line(peaks_gb: Mapping[int, float]) -> MemoryLine:
    """The least-squares line through measured ``{micro_batch: peak GB}`` (two points or more, distinct sizes)."""
    if len(peaks_gb) < 2:
        raise FitError(
            f"peaks measured at {sorted(peaks_gb)}: a line needs two micro-batch sizes or more; e.g. --probe 2 4 8"
        )
    bad = [m for m in peaks_gb if not (isinstance(m, int) and m >= 1)]
    if bad:
        raise FitError(f"micro-batch sizes {bad} are not whole numbers >= 1: measure at sizes like 2 4 8")
    xs, ys = list(peaks_gb), [float(peaks_gb[m]) for m in peaks_gb]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sum((x - x_mean) ** 2 for x in xs)
    if not slope > 0:
        shown = ", ".join(f"{m}: {peaks_gb[m]:.2f} GB" for m in sorted(peaks_gb))
        raise FitError(
            f"the peaks do not grow with the micro-batch ({shown}), so no line predicts larger ones: measure at "
            "sizes further apart, e.g. --probe 4 8 16"
        )
    return MemoryLine(fixed_gb=y_mean - slope * x_mean, per_sample_gb=slope)


@dataclass(frozen=True)
class JobPlan:
    """The worlds a job may run at, as its launcher is told, and its fixed global batch."""

    global_batch: int
    """``train.global_batch``: samples per step across all ranks, the same at every world."""
    min_nodes: int
    """The fewest nodes it keeps training with: the launcher's ``--min-nodes`` (``T5_MIN_NODES``)."""
    max_nodes: int
    """The nodes it runs at when whole: the launcher's ``--nodes``."""
    nproc_per_node: int
    """Ranks (GPUs) per node."""

    def worlds(self) -> list[int]:
        """Every planned world size, largest first."""
        return [n * self.nproc_per_node for n in range(self.max_nodes, self.min_nodes - 1, -1)]

    def shares(self) -> dict[int, int]:
        """Each planned world's per-rank share of the global batch, largest world first."""
        self.check()
        return {w: self.global_batch // w for w in self.worlds()}

    def check(self) -> None:
        """Raise FitError naming the value and the fix when a planned world cannot run the global batch."""
        for name, v in (
            ("--nodes", self.max_nodes),
            ("--min-nodes", self.min_nodes),
            ("--nproc-per-node", self.nproc_per_node),
        ):
            if v < 1:
                raise FitError(f"{name} {v} must be >= 1")
        if self.min_nodes > self.max_nodes:
            raise FitError(f"--min-nodes {self.min_nodes} > --nodes {self.max_nodes}: lower --min-nodes")
        if self.global_batch < 1:
            raise FitError(f"train.global_batch={self.global_batch} must be >= 1")
        bad = [w for w in self.worlds() if self.global_batch % w]
        if bad:
            lcm = math.lcm(*self.worlds())
            raise FitError(
                f"train.global_batch={self.global_batch} does not divide by the planned world sizes {bad} "
                f"({self.min_nodes}..{self.max_nodes} nodes x {self.nproc_per_node}): use a multiple of {lcm} "
                f"(e.g. --train.global_batch {lcm * max(1, round(self.global_batch / lcm))}) or raise --min-nodes"
            )


@dataclass(frozen=True)
class Choice:
    """The micro-batch chosen for a plan from what fits, and why."""

    micro_batch: int
    """The largest size that fits and divides every planned world's share."""
    fitting: int
    """The most samples per forward/backward the GPU holds (MemoryLine.largest_fitting)."""
    shares: dict[int, int]
    """Each planned world's per-rank share, largest world first."""

    def micro_batches_per_step(self) -> dict[int, int]:
        """How many micro-batches a rank runs per step at each planned world."""
        return {w: s // self.micro_batch for w, s in self.shares.items()}

    def line(self) -> str:
        """One line: the choice, the shares it divides, and what the GPU would hold beyond it."""
        per_world = ", ".join(
            f"{s} at {w} ranks = {s // self.micro_batch} x {self.micro_batch}" for w, s in self.shares.items()
        )
        full = next(iter(self.shares.values()))
        line = (
            f"train.micro_batch = {self.micro_batch}: the GPU holds {self.fitting} samples per forward/backward; "
            f"per-rank shares {per_world}"
        )
        if self.fitting > full:
            line += (
                f"; the GPU has room for {self.fitting} but a rank's share at the full world is {full}: only a "
                "larger train.global_batch would fill it (that changes the optimisation)"
            )
        return line


def micro_batch_warnings(micro_batch: int, shares: Mapping[int, int]) -> list[str]:
    """What a set ``train.micro_batch`` breaks of the rule at the planned worlds' per-rank ``shares`` (world ->
    share, any order); none for 0 (no limit: a rank's whole share in one forward, by choice)."""
    if micro_batch <= 0 or not shares:
        return []
    full_world = max(shares)
    warnings = []
    if micro_batch > shares[full_world]:
        warnings.append(
            f"train.micro_batch={micro_batch} is above the per-rank share at {full_world} ranks "
            f"({shares[full_world]}): after losing nodes a rank puts up to {micro_batch} samples through a "
            "forward/backward, more GPU memory than the full-size job used; use a divisor of "
            f"{math.gcd(*shares.values())} (python -m training.batch_fit picks one from measured memory)"
        )
    ragged = sorted(w for w, s in shares.items() if s > micro_batch and s % micro_batch)  # smaller: said above
    if ragged:
        warnings.append(
            f"train.micro_batch={micro_batch} does not divide the per-rank share at world sizes {ragged} "
            f"({', '.join(str(shares[w]) for w in ragged)}): a step's last micro-batch is smaller there (another "
            f"shape, compiled again with parallel.compile on); use a divisor of {math.gcd(*shares.values())}"
        )
    return warnings


def choose(plan: JobPlan, fitting: int) -> Choice:
    """The largest micro-batch <= ``fitting`` that divides every planned world's share (see the module doc)."""
    shares = plan.shares()
    if fitting < 1:
        raise FitError(
            "not even one sample per forward/backward fits the GPU with the headroom asked: turn on "
            "--parallel.activation_checkpointing true, use more nodes, or lower --headroom"
        )
    unit = math.gcd(*shares.values())  # divides every share; at most the share at the largest world
    micro = max(d for d in range(1, min(unit, fitting) + 1) if unit % d == 0)
    return Choice(micro_batch=micro, fitting=fitting, shares=shares)

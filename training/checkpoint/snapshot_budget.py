"""How often the in-memory tier snapshots: the smallest interval whose cost stays within a share of training time.

``checkpoint.memory_interval = "auto"`` (the default): the tier (:mod:`training.checkpoint.memory`) measures what a
snapshot costs and what a step takes, and this module turns those figures into an interval. Pure arithmetic, no
clocks and no torch: the tier measures, agrees the figures across ranks and hands them here.

* **cost** (seconds): what one snapshot blocks training: capturing the state and starting its copy, plus waiting
  for the copy before the next optimizer step (the copy overlaps the next forward and backward; what it does not
  hide is blocking). The copy's own time is not the cost: only the part training waits for.
* **step** (seconds): a step's wall time without that blocking (data, forward, backward, optimizer, storage saves).
* **interval** = ceil(cost / (budget x step)), at least 1 and at most ``max_interval`` (the storage checkpoint's
  ``checkpoint.interval``): snapshotting more rarely than the storage tier saves would bound lost work no better
  than storage does, so past it the budget is exceeded (and said) rather than the snapshots thinned further.

    interval_for(cost_s=2.2, step_s=0.45, budget=0.02, max_interval=1000)  # ceil(2.2 / 0.009) = 245
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A recent snapshot's figures weigh this much in the running averages (exponential): a slower node or a new
#: world size shows within a few snapshots, one noisy snapshot does not move the interval by itself.
EMA_WEIGHT = 0.3
#: The interval only comes down when the lower one stays this far below the budget: measurements jitter, and an
#: interval that flips between 5 and 6 every snapshot would say so in the log every time.
HYSTERESIS = 0.2


def interval_for(cost_s: float, step_s: float, budget: float, max_interval: int) -> int:
    """The smallest interval whose blocking stays within `budget` of training time, bounded to [1, max_interval]."""
    if cost_s <= 0:
        return 1
    if step_s <= 0:  # a step too short to time: any snapshot is over budget
        return max(1, max_interval)
    return max(1, min(max_interval, math.ceil(cost_s / (budget * step_s))))


def next_interval(current: int | None, cost_s: float, step_s: float, budget: float, max_interval: int) -> int:
    """`current` kept unless it is over budget (then the smallest within it) or a smaller one is comfortably within
    it (HYSTERESIS below the budget). None: nothing chosen yet, the plain smallest within budget."""
    need = interval_for(cost_s, step_s, budget, max_interval)
    if current is None or need > current:
        return need
    comfortable = interval_for(cost_s, step_s, budget * (1 - HYSTERESIS), max_interval)
    return comfortable if comfortable < current else current


@dataclass(frozen=True)
class Choice:
    """An interval with the figures it was taken from; `auto` False: a fixed memory_interval being reported."""

    interval: int
    cost_s: float
    step_s: float
    budget: float
    max_interval: int
    auto: bool = True

    @property
    def share(self) -> float:
        """The share of training time snapshots block at this interval."""
        return self.cost_s / (self.interval * self.step_s) if self.step_s > 0 else math.inf

    @property
    def auto_interval(self) -> int:
        """What auto takes for these figures."""
        return interval_for(self.cost_s, self.step_s, self.budget, self.max_interval)

    def line(self) -> str:
        """The log line that says what was chosen and what it means for lost work (or that a fixed one is over)."""
        figures = f"each blocks {_s(self.cost_s)} s of {_s(self.step_s)} s steps"
        if not self.auto:
            return (
                f"[checkpoint] memory_interval={self.interval} costs {_pct(self.share)} of training time "
                f"({figures}), above checkpoint.memory_budget {_pct(self.budget)}: `auto` would take "
                f"{_every(self.auto_interval)}"
            )
        over = (
            f", over the budget {_pct(self.budget)}: at most checkpoint.interval={self.max_interval}, the "
            "storage checkpoint's interval"
            if self.share > self.budget
            else f", budget {_pct(self.budget)}"
        )
        steps = "1 step" if self.interval == 1 else f"{self.interval} steps"
        return (
            f"[checkpoint] in-memory snapshot {_every(self.interval)} ({figures}: {_pct(self.share)} of "
            f"training time{over}): a failure costs at most {steps}"
        )

    def record(self) -> dict:
        """The fields of the metrics record (event ``snapshot_interval``)."""
        return {
            "interval": self.interval,
            "mode": "auto" if self.auto else "fixed",
            "cost_s": round(self.cost_s, 4),
            "step_s": round(self.step_s, 4),
            "share": round(self.share, 5),
            "budget": self.budget,
            "auto_interval": self.auto_interval,
            "detail": self.line(),
        }


class Pace:
    """Running averages of the agreed figures and the interval taken from them (the same on every rank: every rank
    feeds it the same agreed numbers, so every rank decides the same snapshot steps)."""

    def __init__(self, *, budget: float, max_interval: int, fixed: int | None):
        self.budget, self.max_interval, self.fixed = budget, max(1, max_interval), fixed
        self.cost_s: float | None = None
        self.step_s: float | None = None
        self.chosen: Choice | None = None

    def add(self, cost_s: float, step_s: float) -> None:
        if self.cost_s is None or self.step_s is None:
            self.cost_s, self.step_s = cost_s, step_s
        else:
            self.cost_s += EMA_WEIGHT * (cost_s - self.cost_s)
            self.step_s += EMA_WEIGHT * (step_s - self.step_s)

    def decide(self) -> Choice | None:
        """auto: the new Choice when the interval changes (the first one too), else None."""
        assert self.cost_s is not None and self.step_s is not None
        current = self.chosen.interval if self.chosen else None
        n = next_interval(current, self.cost_s, self.step_s, self.budget, self.max_interval)
        if n == current:
            return None
        self.chosen = Choice(n, self.cost_s, self.step_s, self.budget, self.max_interval)
        return self.chosen

    def judge_fixed(self) -> Choice | None:
        """A fixed interval: its Choice when it costs more than the budget (to be reported once), else None."""
        assert self.fixed and self.cost_s is not None and self.step_s is not None
        got = Choice(self.fixed, self.cost_s, self.step_s, self.budget, self.max_interval, auto=False)
        return got if got.share > self.budget else None


def _every(n: int) -> str:
    return "every step" if n == 1 else f"every {n} steps"


def _s(x: float) -> str:
    return f"{x:.2g}" if x < 1 else f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if 100 * x != round(100 * x) else f"{100 * x:g}%"

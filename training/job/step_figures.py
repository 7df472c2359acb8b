"""The per-step figures the host needs (global loss sum, gradient norm) kept on the device between read points
(issue 51, lever 3).

Reading a device value on the host (``.item()``, ``float()``, ``.tolist()``) makes the CPU wait for every kernel
queued before it, so the next step's kernels cannot be queued while this one runs. The trainer therefore leaves
each step's ``[loss sum, gradient norm]`` on the device and reads the figures of all the steps since the last read
in one copy, at a *read point*: a step whose progress line is due, a storage save or memory snapshot is due, a
stop, the last step, or a fault that ends the process. The non-finite guard then replays its per-step decisions
on the read values, in step order, exactly as it made them before on each step; the optimizer meanwhile skipped
each non-finite step's update on the device (``torch_private.optimizer_step_unless``). Every save and snapshot
happens at a read point after that replay, so none can hold a state the guard refuses.

    figures = StepFigures(guard)
    figures.add(step, figures_tensor, n_targets)   # every step; no read
    for step, loss, grad_norm in figures.read():   # at a read point, in step order; may raise Diverged
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from training.job.guard import NonFiniteGuard


@dataclass
class _Pending:
    step: int
    figures: torch.Tensor  # [global loss sum, global gradient norm], float64, on the training device
    n_targets: float  # the global target count (host): the loss is the sum over it


class StepFigures:
    """Steps whose figures are still on the device, and their one read (see the module docstring)."""

    def __init__(self, guard: NonFiniteGuard):
        self.guard = guard
        self._pending: list[_Pending] = []

    def add(self, step: int, figures: torch.Tensor, n_targets: float) -> None:
        self._pending.append(_Pending(step, figures, n_targets))

    @property
    def unread(self) -> int:
        return len(self._pending)

    def read(self) -> Iterator[tuple[int, float, float]]:
        """``(step, loss, grad_norm)`` of every unread step, in step order, from one host copy. The guard judges
        each before it is yielded: where it stops the run (Diverged) the steps before it have been yielded."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        values = torch.stack([p.figures for p in pending]).tolist()  # the interval's one wait for the device
        for p, (total, norm) in zip(pending, values):
            loss = total / p.n_targets
            self.guard.step_ok(p.step, loss, norm)  # a bad step's update was already skipped on the device
            yield p.step, loss, norm

"""Non-finite guard: a diverged run stops with an error instead of checkpointing NaN over good state.

A step whose loss or gradient norm is not finite skips its optimizer update (the weights stay as they
were) and is never checkpointed. After ``max_bad_steps`` such steps in a row the run stops (exit 5)
and the existing checkpoints, all of finite state, are kept. Before any checkpoint is written the
weights themselves are checked too: an update with a huge learning rate can turn finite gradients
into infinite weights one step before the loss shows it.

When it acts: with fused AdamW the trainer skips a bad step's update on the device and calls ``step_ok`` for
each step at the first *read point* at or after it (a progress line, a save or snapshot, a stop, the last step:
:mod:`training.job.step_figures`), in step order, with the same values, so the decisions and the Diverged line
are those of a per-step check. Every save and snapshot comes at a read point, after those calls: no checkpoint
holds a state this guard refuses. With the other AdamW implementations it is called in each step, before the
optimizer steps.

    guard = NonFiniteGuard(max_bad_steps=1)
    if guard.step_ok(step, loss, grad_norm): optimizer.step()
    guard.check_weights(model, step)        # before a save; raises Diverged
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from training.errors import Diverged


class NonFiniteGuard:
    def __init__(self, max_bad_steps: int):
        self.max_bad_steps = max_bad_steps
        self.bad_in_a_row = 0

    def step_ok(self, step: int, loss: float, grad_norm: float) -> bool:
        """True if the step's update may be applied. Raises Diverged after too many bad steps in a row.

        `loss` and `grad_norm` are global (all-reduced), so every rank decides the same."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.bad_in_a_row = 0
            return True
        self.bad_in_a_row += 1
        if self.bad_in_a_row >= self.max_bad_steps:
            raise Diverged(
                f"non-finite loss {loss} / gradient norm {grad_norm} at step {step} "
                f"({self.bad_in_a_row} bad step(s) in a row, train.max_bad_steps={self.max_bad_steps}); "
                "the run stopped without checkpointing it. Lower train.lr or raise train.warmup_steps"
            )
        return False

    def ok_to_checkpoint(self) -> bool:
        """False while the newest step was bad: its state is not saved."""
        return self.bad_in_a_row == 0

    @staticmethod
    def check_weights(model: torch.nn.Module, step: int) -> None:
        """Raise Diverged (on every rank) if any rank's shard of the weights is not finite."""
        ok = torch.ones((), dtype=torch.int64)
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if not bool(torch.isfinite(local).all()):
                ok.zero_()
                break
        ok = ok.to(next(model.parameters()).device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not int(ok.item()):
            raise Diverged(
                f"the weights after step {step} are not finite (the update overflowed); the run stopped "
                "without checkpointing them. Lower train.lr or raise train.warmup_steps"
            )

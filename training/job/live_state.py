"""What a survivor of an in-place recovery keeps instead of restoring it: its live shards and optimizer state.

A survivor whose rank and world size are unchanged (the agreement gives a replacement the rank it replaces) holds,
in its old model and optimizer, exactly the state of the step it completed last: a collective fails before the
optimizer steps, or after the step's progress is counted. The new model and optimizer (built on the new group's
mesh) get copies of it through public API only (``DTensor.to_local()`` and ``copy_`` under ``no_grad``,
``DTensor.from_local`` for the optimizer's moments, the optimizer's ``state`` and ``param_groups``), so the
checkpoint manager needs to read nothing for this rank (``CheckpointManager.restore(held=...)``): no snapshot read,
no CRC pass, no ``set_state_dict``. The RNG is the one noted at the step's end (a failed forward may have drawn
dropout from the live one). If the restore chooses another step (a rank one step behind, a shard lost with its
snapshot), it loads that step over all of this, as at any start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from training.checkpoint.local_shards import laid_out_like, local_shard


@dataclass
class LiveState:
    """One rank's training state at ``step``, held by reference to the old objects' tensors (nothing copied)."""

    step: int
    params: list[tuple[str, torch.Tensor]]  # name, local shard
    buffers: list[tuple[str, torch.Tensor]]
    optim: list[dict[str, torch.Tensor]]  # per parameter, in the parameters' order
    groups: list[dict[str, Any]]  # the optimizer's param_groups without their params (lr as scheduled)
    scheduler: dict[str, Any]
    progress: dict[str, int]
    rng: dict[str, torch.Tensor]

    @classmethod
    def capture(
        cls, *, step: int, model, optimizer, scheduler, progress, rng: dict[str, torch.Tensor]
    ) -> "LiveState | None":
        """None when the shards cannot be had (the rank then restores as before). A collective that failed inside
        the forward or backward leaves FSDP2's unsharded parameters registered on its modules: the root's public
        ``reset_iter_state()`` (torch's recovery step after an exception mid-forward or mid-backward: it reshards
        every group and discards the failed iteration's gradients) comes first."""
        if isinstance(model, FSDPModule):
            try:
                model.reset_iter_state()
            except Exception:  # noqa: BLE001 - an in-flight collective's error again: restore instead
                return None
        params = list(model.named_parameters())
        if not all(isinstance(p, DTensor) for _, p in params):
            return None
        return cls(
            step=step,
            params=[(n, local_shard(p.detach())) for n, p in params],
            buffers=[(n, local_shard(b)) for n, b in model.named_buffers()],
            optim=[{k: local_shard(v) for k, v in optimizer.state.get(p, {}).items()} for _, p in params],
            groups=[{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            scheduler=scheduler.state_dict(),
            progress=progress.state_dict(),
            rng=rng,
        )

    def install(self, *, model, optimizer, scheduler, progress, rng_state) -> str:
        """Copy this state into the freshly built objects; "" when done, else why not (the shards' names or shapes
        differ: nothing is copied and the rank restores as before)."""
        params = list(model.named_parameters())
        if [n for n, _ in params] != [n for n, _ in self.params]:
            return "the rebuilt model's parameters are not the survivor's"
        for (name, p), (_, old) in zip(params, self.params):
            if local_shard(p).shape != old.shape:
                return f"{name}'s local shard is {tuple(local_shard(p).shape)}, was {tuple(old.shape)}"
        with torch.no_grad():
            for (_, p), (_, old) in zip(params, self.params):
                local_shard(p).copy_(old)
            for (_, b), (_, old) in zip(model.named_buffers(), self.buffers):
                local_shard(b).copy_(old)
            for (_, p), state in zip(params, self.optim):
                if state:
                    optimizer.state[p] = {k: _kept(p, k, v) for k, v in state.items()}
        for group, kept in zip(optimizer.param_groups, self.groups):
            group.update(kept)
        scheduler.load_state_dict(self.scheduler)
        progress.load_state_dict(self.progress)
        rng_state.load_state_dict(self.rng)
        return ""


def _kept(param: torch.Tensor, key: str, value: torch.Tensor) -> torch.Tensor:
    """A copy of one kept optimizer entry for ``param``: the step count as it was, a moment laid out as ``param``."""
    return value.clone() if key == "step" else laid_out_like(param, value)

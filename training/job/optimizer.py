"""The optimizer: AdamW (betas 0.9/0.95) over the sharded parameters, on the implementation ``train.adamw_impl``
names.

* 'fused' (the default, what every run used before the setting existed): one kernel for all parameters. On CUDA
  the foreach version took ~60 ms of a 0.6 s t5-large step on an H100. On the CPU too: a restarted worker's first
  optimizer step (DCP runs one to create the state a restore fills) spends most of its time on DTensor sharding
  propagation, once per op, and fused is one op where foreach is ~10: 0.17 s against 0.56 s for the debug preset,
  a third of a lost node's restore.
* 'foreach': multi-tensor ops (a handful of kernels per parameter group);
* 'for_loop': one parameter at a time (the reference; bitwise equal to 'foreach' on the CPU).

The maths is the same; only the rounding of the update differs between 'fused' and the other two (a few ulps),
so the setting is not part of the run's identity: a resume may change it, and a resume with the same one is
bitwise. The state dict has the same keys with each.

Each step runs on the parameters' local shards (:class:`ShardLocalAdamW`): AdamW is elementwise, so DTensor's
dispatch of the step only forwards each op to the local shards, and its first call in a process, and on each new
device mesh (an in-place recovery builds one per epoch), spent 0.33 s of the debug preset's first step on sharding
propagation (profiled), the replacement's start on every in-place recovery's path.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.optim.adamw import adamw

from training.checkpoint.local_shards import laid_out_like, local_shard

IMPLS = ("fused", "foreach", "for_loop")
BETAS = (0.9, 0.95)


def build_adamw(params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float, impl: str):
    """``torch.optim.AdamW`` on the implementation ``impl`` (one of IMPLS)."""
    if impl not in IMPLS:
        raise ValueError(f"train.adamw_impl={impl!r}: use one of {', '.join(IMPLS)}")
    flags = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False)}[impl]
    return ShardLocalAdamW(params, lr=lr, weight_decay=weight_decay, betas=BETAS, **flags)


class ShardLocalAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose step runs torch's functional AdamW (``torch.optim.adamw.adamw``, the kernels
    ``AdamW.step`` calls) on each parameter's, gradient's and moment's local shard (module docstring). Its state is
    torch's: the same keys, moments laid out as their parameters (DTensors on FSDP2's mesh), ``step`` where torch
    keeps it, so DCP's ``get_state_dict``/``set_state_dict``, the snapshots and earlier checkpoints see no
    difference. A ``found_inf`` flag set on the optimizer is honoured as ``AdamW.step`` honours it
    (:func:`training.torch_private.optimizer_step_unless`). Built without amsgrad, maximize or a differentiable
    step (the refused settings name themselves)."""

    def __init__(self, params, **kwargs):
        for name in ("amsgrad", "maximize", "differentiable", "capturable"):
            if kwargs.get(name):
                raise ValueError(f"ShardLocalAdamW: {name}=True is not supported (this project never sets it)")
        super().__init__(params, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(self._initial_state(p, group))
                params.append(local_shard(p))
                grads.append(local_shard(p.grad))
                exp_avgs.append(local_shard(state["exp_avg"]))
                exp_avg_sqs.append(local_shard(state["exp_avg_sq"]))
                steps.append(state["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adamw(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                foreach=group["foreach"],
                fused=group["fused"],
                grad_scale=getattr(self, "grad_scale", None),
                found_inf=getattr(self, "found_inf", None),
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )
        return loss

    @staticmethod
    def _initial_state(p: torch.Tensor, group: dict) -> dict[str, torch.Tensor]:
        """What ``torch.optim.Adam`` creates for a parameter's first step: ``step`` a float32 scalar on the
        parameter's device for the fused kernel, else on the host (float64 when that is the default dtype), and
        both moments zero, laid out as the parameter."""
        if group["fused"]:
            step = torch.zeros((), dtype=torch.float32, device=p.device)
        else:
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            step = torch.tensor(0.0, dtype=scalar, device="cpu")
        zeros = torch.zeros_like(local_shard(p))
        return {"step": step, "exp_avg": laid_out_like(p, zeros), "exp_avg_sq": laid_out_like(p, zeros)}

"""A same-layout restore that copies a snapshot's shards straight into the model and the optimizer.

``set_state_dict`` (torch.distributed.checkpoint.state_dict) can only load an optimizer whose state exists, and
creates it by stepping the optimizer once on zero gradients (its ``_init_optim_state``); the template the memory
tier built its DTensors against (``get_state_dict``) paid that too. In a process that has not trained yet (a
restarted worker, an in-place replacement: every restore that matters) that is a whole AdamW step over the model,
a ``zeros_like`` of both moments, and the first sharding propagation of the fused step: 3.9 of a 5.6 s restore of
t5-base from its node's memory on this CPU (profiled 2026-11-30); then the loaded moments were copied into those
zeros, and on the host every shard had been cloned off the mapped snapshot first.

A snapshot taken at this rank and world size holds exactly this rank's local shards, so they are copied once:
the model's into its parameters' own shards (``get_model_state_dict``, which for FSDP2 returns them without a
copy and initialises nothing), the moments into new tensors on the parameter's device, laid out as the parameter
is (``DTensor.from_local``; ``training.job.live_state`` uses the same for a survivor), the ``param_groups`` (the
scheduled lr) from the snapshot. Public API only. Anything that does not line up (names, shapes, dtypes, group
sizes) is found before the first byte is copied, and the caller loads the snapshot the general way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (its local shard for a DTensor, else ``t``)."""
    return t.to_local() if isinstance(t, DTensor) else t


def laid_out_like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """A copy of ``local`` on ``param``'s device, laid out as ``param`` is (a DTensor on its mesh when it is one):
    an optimizer moment for ``param``."""
    copy = torch.empty_like(local_shard(param), dtype=local.dtype).copy_(local)
    if isinstance(param, DTensor):
        mesh, placements = param.device_mesh, param.placements
        return DTensor.from_local(copy, mesh, placements, shape=param.shape, stride=param.stride())
    return copy


def load_local_shards(sd: dict[str, Any], *, model, optimizer) -> str:
    """Copy ``sd`` (a TrainState's ``model`` and ``optim`` parts as they were saved at this rank and world size,
    every tensor a plain local shard) into ``model`` and ``optimizer``. "" when done, else why not: then nothing
    was copied."""
    live = get_model_state_dict(model)
    why = _model_mismatch(live, sd["model"])
    if why:
        return why
    why = _optimizer_mismatch(optimizer, sd["optim"], live)
    if why:
        return why
    with torch.no_grad():
        for fqn, saved in sd["model"].items():
            local_shard(live[fqn]).copy_(saved)
        for group, saved_group in zip(optimizer.param_groups, sd["optim"]["param_groups"]):
            for p, fqn in zip(group["params"], saved_group["params"]):
                state = sd["optim"]["state"].get(fqn)
                if state:
                    optimizer.state[p] = {k: _state_like(p, k, v, group) for k, v in state.items()}
            group.update({k: v for k, v in saved_group.items() if k != "params"})
    return ""


def _model_mismatch(live: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> str:
    if set(live) != set(saved):
        extra, missing = sorted(set(saved) - set(live)), sorted(set(live) - set(saved))
        return f"the snapshot's model entries differ (not in the model: {extra[:3]}; not saved: {missing[:3]})"
    for fqn, t in live.items():
        shard, got = local_shard(t), saved[fqn]
        if not isinstance(got, torch.Tensor) or got.shape != shard.shape or got.dtype != shard.dtype:
            found = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            return f"{fqn}: saved {found}, this rank's shard is {tuple(shard.shape)} {shard.dtype}"
    return ""


def _optimizer_mismatch(optimizer, saved: dict[str, Any], live: dict[str, torch.Tensor]) -> str:
    """Why the saved optimizer is not this one's, "" when it is: DCP saves each group's parameters by name, in the
    group's own order, and each name must be the parameter's in the model (``live``: its shard is the parameter's
    own storage)."""
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return "the snapshot's optimizer groups are not this optimizer's"
    for group, saved_group in zip(optimizer.param_groups, groups):
        if len(saved_group.get("params", ())) != len(group["params"]):
            return "an optimizer group's parameters differ from the snapshot's"
        for p, fqn in zip(group["params"], saved_group["params"]):
            shard, named = local_shard(p), live.get(fqn)
            if named is None or (shard.numel() and local_shard(named).data_ptr() != shard.data_ptr()):
                return f"the snapshot's optimizer entry {fqn} is not this optimizer's parameter of that name"
            for k, v in saved["state"].get(fqn, {}).items():
                if k != "step" and (not isinstance(v, torch.Tensor) or v.shape != shard.shape):
                    return f"{fqn}'s optimizer state {k} does not fit this rank's shard"
    return ""


def _state_like(param: torch.Tensor, key: str, saved: Any, group: dict[str, Any]) -> Any:
    """The saved entry copied where the optimizer keeps it: a moment on the parameter's device, laid out as the
    parameter; ``step`` on the parameter's device for the fused and capturable kernels, else on the host (where
    ``torch.optim.Adam`` puts it when it creates the state)."""
    if not isinstance(saved, torch.Tensor):
        return saved
    if key == "step":
        on_device = group.get("fused") or group.get("capturable")
        return saved.to(device=local_shard(param).device if on_device else "cpu", copy=True)
    return laid_out_like(param, saved)

"""Gradient clipping on the gradients' local shards: the global L2 norm from each rank's local sum of squares and
one ``all_reduce``, then every local shard scaled, as ``torch.nn.utils.clip_grad_norm_`` scales the whole.

``clip_grad_norm_`` on FSDP2's DTensor gradients runs through DTensor's dispatch, whose first call in a process,
and on each new device mesh (an in-place recovery builds one per epoch), spent 0.24 s of the debug preset's first
step on sharding propagation (profiled): the replacement's start, on every in-place recovery's path. Here the
arithmetic is the same (torch's ``get_total_norm`` of each rank's shards, squared, summed across the shards' group,
``max_norm / (norm + 1e-6)`` clamped to 1, every gradient multiplied by it with the multi-tensor kernel, a
non-finite norm left for the caller's guard) and only its rounding order differs: every run of
the project clips this way, so an interrupted run still equals an uninterrupted one bit for bit.

Sharded gradients (``Shard`` on a one-dimensional mesh: FSDP2's) add their local sums across the mesh's group;
replicated ones and plain tensors count once. Any other layout is refused by name.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from training.torch_private import scale_in_place

#: torch.nn.utils.clip_grad_norm_'s guard against a zero norm.
EPS = 1e-6


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sum(x^2) over every element, as the square of torch's total norm of them (``get_total_norm``: one norm per
    tensor with the multi-tensor kernels, then the norm of those), in float32 at least."""
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    norm = torch.nn.utils.get_total_norm(tensors, 2.0).float()
    return norm * norm


def _scale(tensors: list[torch.Tensor], coef: torch.Tensor) -> None:
    """Multiply each tensor by ``coef`` in place, a few kernels per device and dtype."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for (device, dtype), group in groups.items():
        scale_in_place(group, coef.to(device=device, dtype=dtype))


def _split(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor], dist.ProcessGroup | None]:
    """(sharded local shards, tensors counted once, the shards' group)."""
    sharded, once, group = [], [], None
    for g in grads:
        if not isinstance(g, DTensor):
            once.append(g)
            continue
        if g.device_mesh.ndim != 1:
            raise ValueError(
                f"clip_grad_norm: a gradient on a {g.device_mesh.ndim}-D mesh: only 1-D meshes are cut here"
            )
        (placement,) = g.placements
        if isinstance(placement, Shard):
            sharded.append(g.to_local())
            group = g.device_mesh.get_group()
        elif isinstance(placement, Replicate):
            once.append(g.to_local())
        else:
            raise ValueError(f"clip_grad_norm: a gradient placed {placement}: only Shard and Replicate are summed here")
    return sharded, once, group


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` so their global L2 norm is at most ``max_norm`` (``inf``: no limit);
    returns the norm before scaling, a plain scalar tensor on the gradients' device."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sharded, once, group = _split(grads)
    squares = _sum_of_squares(sharded)
    if group is not None:
        dist.all_reduce(squares, group=group)
    squares = squares + _sum_of_squares(once).to(squares.device)
    norm = squares.sqrt()
    coef = torch.clamp(max_norm / (norm + EPS), max=1.0)
    _scale(sharded + once, coef)
    return norm

"""Every private torch API the project uses, in one place: what, where, why no public one serves.

The project extends torch through its public extension points (the rendezvous handler registry for membership,
``torch.distributed.checkpoint`` for checkpoints, the agent's own process for stops and watchdogs). Where none
exists, the use is made through this module and nowhere else, and ``tests/unit/repo/test_torch_private.py`` has a canary
per entry: it fails when a torch upgrade renames, moves or changes the thing, so the upgrade stops here instead
of in a job. Nothing of torch's is replaced at run time: membership is a registered rendezvous handler
(``training.launch.rendezvous``), warm workers an entrypoint handed to the public ``elastic_launch``
(``training.launch.agent``), and ``tests/unit/repo/test_torch_private.py`` refuses any assignment to a torch attribute
other than a configuration flag.

INVENTORY lists each use; the functions below are the only callers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrivateUse:
    """One private torch API: where the project uses it and why nothing public does the job."""

    api: str
    used_by: str
    why: str


INVENTORY = (
    PrivateUse(
        "torch.distributed.distributed_c10d._get_default_store",
        "training.job.watchdog",
        "the heartbeat watchdog's own connection to the workers' store (the round's TCPStore hosted by "
        "rank 0's worker): the default group's store is not exposed publicly.",
    ),
    PrivateUse(
        "torch.distributed.checkpoint.state_dict_loader._load_state_dict and format_utils._EmptyStateDictLoadPlanner",
        "training.compare",
        "load a whole DCP checkpoint into plain tensors without a model or a process group (what torch's "
        "own dcp_to_torch_save does internally).",
    ),
    PrivateUse(
        "TORCH_ELASTIC_WORKER_IDENTICAL=1 (read by SimpleElasticAgent._assign_worker_ranks)",
        "training.launch.commands.launch_env, cluster_assets.k8s.runtime (cluster_facts.torchrun_env)",
        "torchrun's rank assignment from the node's rendezvous rank alone, no gather through rank 0's store "
        "(which waited the store's timeout for a node lost after the round formed, then failed every "
        "agent); torchrun documents the variable only in that private method's docstring.",
    ),
    PrivateUse(
        "torch._dynamo.config.recompile_limit",
        "training.model.compile",
        "raise the recompile cap so every T5 block variant compiles (the documented knob lives there).",
    ),
    PrivateUse(
        "torch.utils._python_dispatch.TorchDispatchMode, torch.utils._pytree.tree_map",
        "training.model.meta_init",
        "record the initialization ops a model runs on the meta device and replay them per shard (torch "
        "documents dispatch modes but keeps them under _python_dispatch).",
    ),
    PrivateUse(
        "torch._higher_order_ops.flex_attention.flex_attention (the HOP behind flex_attention)",
        "training.model.flex",
        "train through FlexAttention on the CPU: the public flex_attention refuses inputs that require grad "
        "there, while its higher-order op has a reference (math) forward and backward on every device.",
    ),
    PrivateUse(
        "Optimizer.found_inf (the attribute GradScaler hands fused Adam/AdamW, read by their step)",
        "training.job.trainer",
        "skip a non-finite step's update on the device, so the non-finite guard need not read the loss and "
        "gradient norm to the host before every optimizer step (issue 51, lever 3); GradScaler, the public user, "
        "would scale and check the gradients itself.",
    ),
    PrivateUse(
        "torch._foreach_mul_ (the multi-tensor multiply torch.nn.utils.clip_grads_with_norm_ runs)",
        "training.job.grad_clip",
        "scale every gradient's local shard by the clip coefficient in a few kernels instead of one per tensor "
        "(~500 launches a step for t5-large): the public clip_grads_with_norm_ takes parameters and scales their "
        "DTensor gradients through DTensor's dispatch, whose sharding propagation the local clip exists to avoid.",
    ),
    PrivateUse(
        "torch._dynamo.explain, torch._dynamo.utils.counters",
        "training.compile_report",
        "count a T5 block's graph breaks with their reasons, and the graphs Dynamo compiled (recompiles across "
        "steps): torch documents explain and the counters for this but keeps them under _dynamo.",
    ),
)


def default_store():
    """The default process group's c10d store (the workers' store)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def load_dcp_state_dict(state_dict: dict, path: str) -> None:
    """Fill ``state_dict`` (empty) with every tensor of the DCP checkpoint at ``path``, no process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(
        state_dict, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )


def raise_recompile_limit(at_least: int) -> None:
    """Let Dynamo compile at least this many variants of one function."""
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, at_least)


def dispatch_mode_and_tree_map():
    """``(TorchDispatchMode, tree_map)`` for the meta-init recorder."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    return TorchDispatchMode, tree_map


def flex_attention_reference(query, key, value, score_mod, score_mod_buffers: tuple, block_mask, *, scale: float):
    """``flex_attention``'s output from its higher-order op's reference implementation, differentiable on the CPU
    (scores materialised in fp32). ``score_mod(score, b, h, q, kv, *score_mod_buffers)`` or None; the gradient
    reaches ``score_mod_buffers`` too. ``block_mask``: a ``BlockMask`` (not None)."""
    import torch
    from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
    from torch.nn.attention.flex_attention import _apply_kernel_options, _identity

    options = _apply_kernel_options(query, key, value, return_lse=False, kernel_options=None)
    # The op's backward gives a buffer a gradient only if its saved copy requires grad; activation checkpointing
    # saves detached copies (and recomputes them), so the gradient would be written into the bias itself. Saved
    # as they are instead: this op's inputs stay alive until the backward (the CPU reference path only).
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        out, _lse, _max = flex_attention_hop(
            query,
            key,
            value,
            score_mod or _identity,
            block_mask.as_tuple(),
            scale,
            options,
            tuple(score_mod_buffers),
            (),  # the mask rule's own tensors stay in its closure: the reference calls it eagerly
        )
    return out


def dynamo_explain(fn, *args, **kwargs) -> tuple[int, int, list[str]]:
    """``(graphs, graph breaks, one line per break reason)`` of tracing ``fn(*args, **kwargs)`` with Dynamo (nothing
    is compiled or kept)."""
    import torch

    out = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = [str(b.reason).strip().splitlines()[0] for b in out.break_reasons]
    return out.graph_count, out.graph_break_count, reasons


def dynamo_graphs_compiled() -> int:
    """How many distinct graphs Dynamo has compiled in this process since the last ``torch.compiler.reset()``."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def optimizer_step_unless(optimizer, found_inf) -> None:
    """``optimizer.step()`` decided on the device: where ``found_inf`` (a float32 scalar tensor) is non-zero the
    fused Adam/AdamW kernel leaves the parameters, both moments and the step count as they were, with no read of
    the flag on the host. Only the fused implementations take it (the others refuse a flag)."""
    optimizer.found_inf = found_inf
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def scale_in_place(tensors: list, factor) -> None:
    """Multiply every tensor of ``tensors`` (plain tensors, one device and dtype as ``factor`` is moved to) by the
    scalar tensor ``factor``, in place, with torch's multi-tensor kernel."""
    import torch

    if tensors:
        torch._foreach_mul_(tensors, factor)

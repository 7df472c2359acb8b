"""Regional compilation (``parallel.compile``): ``torch.compile`` each T5 block in place.

Each encoder and decoder ``T5Block`` is compiled on its own (``block.compile()``), so Inductor can fuse what makes
a T5 step many small kernels (the fp32 RMS layer norms and their casts, the gated GELU, residual adds, dropout)
while the model keeps its modules, parameter names and state-dict keys (checkpoints are unchanged; wrapping in
``torch.compile(block)`` would add ``_orig_mod.`` to every key). Blocks share their compiled code (they differ only
in weights, which Dynamo takes as graph inputs), so the number of graphs does not grow with depth: one per kind of
block (first or later, encoder or decoder) and per variant of its inputs (padding mask or none, then a dynamic
batch size once a second size is seen), about a dozen at most, compiled when first met.

Call order in the model build: HF activation checkpointing (it wraps ``T5Block.forward``), then
:func:`apply_regional_compile`, then ``fully_shard`` (FSDP2's all-gather and reshard hooks run inside the compiled
call but outside its graphs: FSDP2 wraps them in ``torch._dynamo.disable``). With activation checkpointing the
first decoder block runs uncompiled: HF's T5Attention sets ``requires_grad`` on its cross-attention's zero bias
under checkpointing, which Dynamo cannot trace inside ``torch.utils.checkpoint``; every other block compiles.

CPU: Inductor's vectorised C++ kernels are turned off (``cpp.simdlen=1``). In torch 2.13 the tiled (transposing)
kernel that fuses the backward of T5's permuted position bias into the embedding gradient of
``relative_attention_bias`` computes wrong scatter offsets when the bias is broadcast over a padded batch: wrong
gradients and writes past the buffer. Seen with transformers' 'sdpa' and this project's 'sdpa_bias' (both combine
bias and padding mask before the kernel), not with 'eager'. The option concerns only the C++ backend; GPU kernels
(Triton) are unaffected.
"""

from __future__ import annotations

import torch
from training.torch_private import raise_recompile_limit

COMPILE_CHOICES = ("auto", "on", "off")


def compile_enabled(setting: str) -> bool:
    """Whether ``parallel.compile = setting`` compiles. 'auto' is off on every device for now: on the CPU the compile
    time outweighs the small models' steps, and on GPUs the gain is not measured yet (README.md, "Attention kernels
    and regional compilation")."""
    if setting not in COMPILE_CHOICES:
        raise ValueError(f"parallel.compile={setting!r}: use one of {', '.join(COMPILE_CHOICES)}")
    return setting == "on"


def apply_regional_compile(model: torch.nn.Module, enabled: bool, *, backend: str = "inductor") -> int:
    """Compile every ``T5Block`` of ``model`` (a T5ForConditionalGeneration) in place when ``enabled``; returns how
    many blocks were compiled (0 when not enabled). Also turns the decoder's key/value cache off (training never
    decodes) and raises Dynamo's process-wide recompile limit to at least 32. Compilation itself happens on the
    first forward. ``backend``: Inductor for training; 'eager' traces with Dynamo only (the same graphs, guards
    and recompiles, no code generated: training.compile_report's cheap mode)."""
    if not enabled:
        return 0
    # With a cache each decoder block guards on its own layer's cache entry: one recompile per block.
    model.decoder.config.use_cache = False
    # All blocks share T5Block's forward, whose variants Dynamo caps at recompile_limit (8 by default; past it the
    # remaining calls silently run uncompiled): the variants listed in the module docstring come to 12.
    raise_recompile_limit(32)
    blocks = [block for stack in (model.encoder, model.decoder) for block in stack.block]
    for block in blocks:
        if backend == "inductor":
            block.compile(options={"cpp.simdlen": 1})  # see the module docstring (CPU only)
        else:
            block.compile(backend=backend)
    return len(blocks)

"""T5 attention on FlexAttention (``model.attention = 'flex'``): the position bias as a ``score_mod``, masks as a
``BlockMask``, so no [batch, heads, Sq, Sk] score tensor is ever materialised on a GPU.

Registered with transformers' public attention interfaces (``AttentionInterface`` for the kernel,
``AttentionMaskInterface`` for the masks), which ``T5Attention`` in transformers 5.x calls; nothing of T5's is
replaced.

* Self-attention: ``score + position_bias[0, h, q, kv]``. ``position_bias`` is what ``T5Attention.compute_bias``
  made from the per-head table (``relative_attention_bias``, [num_buckets, heads]) with HF's own bucketing of
  ``kv - q``; the first block of each stack computes it once and the others reuse it, so it is [1, H, Sq, Sk],
  never per sample. Why not the [num_buckets, H] table itself in the ``score_mod``: Flex computes the gradient of
  a tensor the ``score_mod`` reads with one atomic add per score element, and with 32 buckets about half the
  scores of a 512-token sequence land in the two far-distance buckets: every batch element and query would
  contend for the same few addresses. Reading the [1, H, Sq, Sk] bias spreads those adds over H x Sq x Sk
  addresses (batch-fold contention only), and HF's embedding backward folds them into the table. Which of the two
  is faster is a GPU measurement (docs/performance.md); this is the one with the bounded contention.
* Causal decoder self-attention and any padding: a ``BlockMask`` built once per stack and forward by
  :func:`t5_block_mask` (transformers passes it to every layer). An unpadded encoder and cross-attention need no
  mask (``None``); the causal mask of an unpadded decoder is built once per shape and kept.
* Cross-attention: no bias (T5 has none there; ``T5Attention`` hands a tensor of zeros, which is not read).
* ``scale = 1.0`` (T5 does not scale the scores). No attention dropout: Flex has none, so ``model.dropout > 0`` is
  refused with this kernel (the GPU presets use 0).

Where it runs: on CUDA through ``torch.compile(flex_attention)`` (inlined when the T5 block is itself compiled,
``parallel.compile``): the fused Triton kernels. On the CPU ``flex_attention`` has no backward (it raises when an
input requires grad), so training on the CPU goes through the same higher-order op's reference implementation
(``training.torch_private.flex_attention_reference``: scores materialised in fp32, exact, slow); without grad the
public ``flex_attention`` runs. That is what lets the CPU tests compare losses and gradients with eager.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

FLEX = "flex"


def register() -> str:
    """Make ``attn_implementation='flex'`` resolve in transformers (kernel and mask builder); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(FLEX, t5_flex_attention)
    AttentionMaskInterface.register(FLEX, t5_block_mask)
    return FLEX


def t5_flex_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface function for ``T5Attention`` (query/key/value [B, H, S, D]; ``attention_mask`` a
    ``BlockMask`` or None, as :func:`t5_block_mask` builds it); returns the output as [B, Sq, H, D] and no
    attention weights."""
    if dropout:
        raise ValueError(f"model.attention=flex has no attention dropout (dropout={dropout}): use --model.dropout 0")
    cross = module.is_decoder and not module.is_causal
    buffers = () if cross or position_bias is None else (position_bias,)
    out = run_flex(query, key, value, add_bias if buffers else None, buffers, attention_mask)
    return out.transpose(1, 2).contiguous(), None


def add_bias(score, b, h, q_idx, kv_idx, bias):
    """The ``score_mod``: T5's position bias for head ``h`` at (``q_idx``, ``kv_idx``), the same for every sample."""
    return score + bias[0, h, q_idx, kv_idx]


def run_flex(query, key, value, score_mod: Callable | None, buffers: tuple, block_mask) -> torch.Tensor:
    """``flex_attention(query, key, value)`` with ``score_mod(score, b, h, q, kv, *buffers)`` and ``block_mask``,
    scale 1.0, on the implementation the device has (module docstring)."""
    from torch.nn.attention.flex_attention import flex_attention

    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, *buffers))
    if query.device.type == "cpu" and needs_grad:
        if block_mask is None:
            block_mask = full_mask(query.shape[2], key.shape[2], str(query.device))
        return cpu_reference(query, key, value, score_mod, buffers, block_mask)
    mod = None if score_mod is None else (lambda score, b, h, q, kv: score_mod(score, b, h, q, kv, *buffers))
    kernel = compiled_flex() if query.device.type == "cuda" else flex_attention
    return kernel(query, key, value, score_mod=mod, block_mask=block_mask, scale=1.0)


@torch.compiler.disable  # the reference does not trace: a compiled T5 block on the CPU runs it between graphs
def cpu_reference(query, key, value, score_mod, buffers: tuple, block_mask) -> torch.Tensor:
    from training.torch_private import flex_attention_reference

    return flex_attention_reference(query, key, value, score_mod, buffers, block_mask, scale=1.0)


@functools.cache
def compiled_flex():
    """``torch.compile(flex_attention)``, made once: uncompiled, flex runs a reference that materialises the scores."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def t5_block_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **_: object,
):
    """HF mask-interface function: the ``BlockMask`` for one stack's forward, or None where every query sees every
    key. ``mask_function``: transformers' causal or bidirectional rule (q, kv indices); ``attention_mask``: the 2D
    padding mask (1 = token) or None; offsets: where the queries and keys start (decoding with a cache)."""
    from transformers.masking_utils import (
        add_offsets_to_mask_function,
        and_masks,
        bidirectional_mask_function,
        padding_mask_function,
        prepare_padding_mask,
    )

    mask_function = mask_function or bidirectional_mask_function
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded:
        if mask_function is bidirectional_mask_function:
            return None
        return unpadded_mask(mask_function, q_length, kv_length, int(q_offset), int(kv_offset), str(device))
    padding = prepare_padding_mask(attention_mask.bool(), kv_length, kv_offset)
    rule = add_offsets_to_mask_function(and_masks(mask_function, padding_mask_function(padding)), q_offset, kv_offset)
    return create_mask(rule, batch_size, q_length, kv_length, device)


@functools.lru_cache(maxsize=16)
def unpadded_mask(mask_function: Callable, q_length: int, kv_length: int, q_offset: int, kv_offset: int, device: str):
    """The same for every sample (a causal mask): built once per shape and kept."""
    from transformers.masking_utils import add_offsets_to_mask_function

    rule = add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
    return create_mask(rule, None, q_length, kv_length, device)


@functools.lru_cache(maxsize=16)
def full_mask(q_length: int, kv_length: int, device: str):
    """Every query sees every key (the reference implementation needs a ``BlockMask`` where flex takes None)."""
    from torch.nn.attention.flex_attention import noop_mask

    return create_mask(noop_mask, None, q_length, kv_length, device)


def create_mask(rule: Callable, batch_size: int | None, q_length: int, kv_length: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(rule, B=batch_size, H=None, Q_LEN=q_length, KV_LEN=kv_length, device=device)

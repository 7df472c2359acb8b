"""T5 attention with the learned relative position bias on SDPA's fused kernels (``model.attention = 'sdpa_bias'``).

T5 adds a learned bias (``relative_attention_bias``, a [num_buckets, heads] table looked up per query/key
distance) to the raw attention scores and does not scale them (scale 1.0). Of SDPA's CUDA kernels only the
memory-efficient one takes an additive bias that needs a gradient (flash takes no mask, cuDNN no mask that
requires grad), and it needs the bias in the query's dtype. This kernel hands
``torch.nn.functional.scaled_dot_product_attention``:

* self-attention: the position bias cast to the compute dtype (the query's: bf16 under FSDP mixed precision or
  autocast) with the padding/causal mask folded in (masked scores set to that dtype's minimum, as HF does).
  HF's stock 'sdpa' keeps the bias in the dtype of the bias table, so with fp32 weights under autocast SDPA gets
  an fp32 bias with bf16 queries (the memory-efficient CUDA kernel refuses a bias of another dtype);
* cross-attention: only the padding mask (boolean, or none at all), because T5 has no position bias there.
  HF's 'sdpa' adds the tensor of zeros T5Attention makes for it: a dense [B, H, Sq, Sk] float mask, which keeps
  the flash and cuDNN kernels out (and needs a gradient under activation checkpointing);
* the trainer's batches are packed windows of the token stream (no padding), so transformers builds no padding
  mask and the self-attention bias reaches the kernel as [1, H, Sq, Sk], broadcast over the batch; only a
  padded batch (fine-tuning data, ``generate``) folds its mask in as a [B, H, Sq, Sk] copy per layer;
* ``scale=1.0`` and HF's dropout probability (0 in eval mode).

Use it by passing ``attn_implementation(cfg.attention)`` as HF's ``attn_implementation`` (T5Config or
``from_pretrained``): it registers the kernel with transformers and returns the name. Weights, state-dict keys
and checkpoints are the same for every kernel.

Dropout: eager drops attention probabilities with ``torch.nn.functional.dropout``; SDPA applies the same
Bernoulli(1 - p) mask and 1/(1 - p) scaling inside the kernel, but a fused CUDA kernel draws it from its own
Philox stream, so training with dropout > 0 matches eager in distribution, not bit for bit. Outputs and
gradients equal eager's (up to rounding) only with dropout 0, which the GPU presets use.

FlexAttention is ``model.attention = 'flex'`` (training.model.flex), not HF's own 'flex_attention': that path
for T5 reads ``position_bias[batch_idx, head_idx, q_idx, kv_idx]`` from a bias whose batch dimension is 1: out of
bounds for every batch index > 0 (an IndexError on the CPU, an illegal memory access in a compiled GPU kernel).
README.md, "Attention kernels and regional compilation", lists what is still to be measured on a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.model.flex import FLEX

SDPA_BIAS = "sdpa_bias"
CHOICES = ("sdpa", "eager", SDPA_BIAS, FLEX)
"""Every valid ``model.attention``: HF's two stock kernels, this module's, and FlexAttention's (training.model.flex)."""


def attn_implementation(attention: str) -> str:
    """The ``attn_implementation`` to give HF for ``model.attention = attention``; registers this module's
    kernel (and its boolean-mask builder) with transformers first, so the name resolves. Idempotent."""
    if attention not in CHOICES:
        raise ValueError(f"model.attention={attention!r}: use one of {', '.join(CHOICES)}")
    if attention == SDPA_BIAS:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(SDPA_BIAS, t5_sdpa_attention)
        # Masks built as for 'sdpa' (boolean, None when nothing is masked); a name without a mask builder would
        # get no padding mask at all from transformers.
        AttentionMaskInterface.register(SDPA_BIAS, sdpa_mask)
    if attention == FLEX:
        from training.model.flex import register

        register()
    return attention


def t5_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface function for ``T5Attention`` (query/key/value [B, H, S, D]); returns the output as
    [B, Sq, H, D] and no attention weights. Other keyword arguments (``scaling``, which T5 always passes as
    1.0) are ignored."""
    if module.is_decoder and not module.is_causal:
        mask = attention_mask  # cross-attention: position_bias is T5Attention's zeros, nothing to add
    else:
        mask = bias_with_mask(
            position_bias.to(query.dtype),
            attention_mask,
            causal=module.is_causal,
            q_len=query.shape[2],
            kv_len=key.shape[2],
        )
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=1.0)
    return out.transpose(1, 2).contiguous(), None


def bias_with_mask(
    bias: torch.Tensor, mask: torch.Tensor | None, *, causal: bool, q_len: int, kv_len: int
) -> torch.Tensor:
    """The additive SDPA mask: ``bias`` [1 or B, H, Sq, Sk] where ``mask`` allows, the minimum of ``bias``'s
    dtype where it does not. ``mask``: boolean (True = attend, as transformers builds it for SDPA) or None; None on
    a causal layer means "causal, no padding" (HF leaves that case to SDPA's is_causal, which cannot be combined
    with a bias)."""
    if mask is None and causal:
        # Bottom-right aligned: a decoding step's single query (Sq = 1) sees every cached key.
        q_pos = torch.arange(q_len, device=bias.device)[:, None] + (kv_len - q_len)
        mask = q_pos >= torch.arange(kv_len, device=bias.device)
    if mask is None:
        return bias
    return torch.where(mask, bias, torch.finfo(bias.dtype).min)

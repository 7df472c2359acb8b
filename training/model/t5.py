"""Model construction and parallelisation: T5 from a config (random init, nothing downloaded), FSDP2."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.model.attention import attn_implementation
from training.config import ConfigError, ModelConfig, ParallelConfig
from training.errors import CheckpointIncompatible
from training.model.meta_init import RecordedInit, record_init
from training.model.pretrained import (
    CONFIG_FILE,
    FEED_FORWARD,
    SHAPE_FIELDS,
    WANTED,
    check_pretrained_dir,
    shape_differences,
    shape_mismatch,
)

log = logging.getLogger("training")


def build_t5_config(cfg: ModelConfig):
    from transformers import T5Config

    # transformers 5.x always ties lm_head to the shared embedding; passing tie_word_embeddings=False
    # would only drop the d_model**-0.5 output scaling and make the initial loss explode.
    return T5Config(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        d_kv=cfg.d_kv,
        d_ff=cfg.d_ff,
        num_layers=cfg.num_layers,
        num_decoder_layers=cfg.num_decoder_layers,
        num_heads=cfg.num_heads,
        feed_forward_proj=FEED_FORWARD,
        dropout_rate=cfg.dropout,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        attn_implementation=attn_implementation(cfg.attention),
    )


def build_model(cfg: ModelConfig, *, seed: int) -> torch.nn.Module:
    """T5ForConditionalGeneration on the CPU, identical on every rank (same seed), or loaded from
    a local pretrained directory (``cfg.init_from``)."""
    from transformers import T5ForConditionalGeneration

    torch.manual_seed(seed)
    if cfg.init_from:
        return load_pretrained(cfg)
    return T5ForConditionalGeneration(build_t5_config(cfg))


def load_pretrained(cfg: ModelConfig) -> torch.nn.Module:
    """The model in ``cfg.init_from``, checked first (training.model.pretrained: config.json, weights, shape) and after
    loading (every weight present and of its config's shape), so a wrong directory is one line, never a model
    with weights silently left at random."""
    from transformers import T5ForConditionalGeneration

    check_pretrained_dir(cfg.init_from, cfg)
    try:
        model, info = T5ForConditionalGeneration.from_pretrained(
            cfg.init_from,
            local_files_only=True,
            output_loading_info=True,
            dropout_rate=cfg.dropout,
            attn_implementation=attn_implementation(cfg.attention),
        )
    except Exception as e:  # noqa: BLE001 - the directory passed the file checks: its content is the problem
        # (safetensors raises its own SafetensorError for a cut-short or garbled file, not an OSError)
        raise _unloadable(cfg.init_from, e) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointIncompatible(
            f"model.init_from={cfg.init_from!r} lacks {len(missing)} of this model's "
            f"weights ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
            f"pass {WANTED}"
        )
    differences = shape_differences(model.config.to_dict(), cfg)
    if differences:
        raise CheckpointIncompatible(shape_mismatch(cfg.init_from, differences))
    return model


def _unloadable(path: str, e: Exception) -> Exception:
    """Why ``from_pretrained`` failed on a directory that passed the file checks, as the job's own error: weights
    of another shape than its own config.json are another model (exit 3), anything else unreadable input (2)."""
    text = str(e).strip()
    if isinstance(e, RuntimeError) and "mismatch" in text:  # transformers: "... `ignore_mismatched_sizes` ..."
        return CheckpointIncompatible(
            f"model.init_from={path!r} holds weights of another shape than its "
            f"{CONFIG_FILE} says (nothing was loaded); pass {WANTED}"
        )
    reason = text.splitlines()[-1] if text else type(e).__name__
    return ConfigError(f"model.init_from={path!r} cannot be loaded: {reason}; pass {WANTED}")


@dataclass
class BuiltOnCpu:
    """A model built whole on the CPU (pretrained weights, or a construction meta init cannot replay)."""

    model: torch.nn.Module

    def materialize(self, model: torch.nn.Module, device: torch.device) -> None:
        self.allocate(model, device)

    def allocate(self, model: torch.nn.Module, device: torch.device) -> None:
        """The weights on `device`, values and all (they were never left undefined)."""
        model.to(device)

    def initialize(self, model: torch.nn.Module) -> None:
        """Nothing to draw: the weights came with the build."""


def build_model_for_sharding(cfg: ModelConfig, *, seed: int) -> RecordedInit | BuiltOnCpu:
    """The model, ready for ``fully_shard``; call ``.materialize(model, device)`` after sharding (or
    ``.allocate(model, device)``, and ``.initialize(model)`` only when no restore fills the weights).

    Random init is built on the meta device and each rank materialises only its shards, with the weights
    :func:`build_model` would give for `seed` (training.model.meta_init); pretrained weights (``init_from``) are
    loaded on the CPU as before."""
    if cfg.init_from:
        return BuiltOnCpu(build_model(cfg, seed=seed))
    from transformers import T5ForConditionalGeneration

    t5_config = build_t5_config(cfg)
    return record_or_build(lambda: T5ForConditionalGeneration(t5_config), seed=seed)


def record_or_build(build: Callable[[], torch.nn.Module], *, seed: int) -> RecordedInit | BuiltOnCpu:
    """``build()`` recorded on the meta device (training.model.meta_init), or, when that cannot reproduce it, run on
    the CPU after ``torch.manual_seed(seed)``, with a warning saying why (the weights are the same either way)."""
    try:
        return record_init(build, seed=seed)
    except (RuntimeError, NotImplementedError) as e:
        # MetaInitUnsupported (a RuntimeError): a write the replay cannot reproduce; the others: a constructor
        # that needs values (e.g. .item() on a tensor it made), which meta tensors do not have.
        log.warning("building the model on the CPU of every rank: meta-device init cannot reproduce it (%s)", e)
        torch.manual_seed(seed)
        return BuiltOnCpu(build())


def model_signature(cfg: ModelConfig) -> dict[str, int]:
    """The shape-defining fields a checkpoint must match to be loaded into this model."""
    return {k: getattr(cfg, k) for k in SHAPE_FIELDS}


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def apply_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute every T5 block in the backward pass (non-reentrant, compatible with FSDP2)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, cfg: ParallelConfig) -> None:
    """Shard each T5 block (encoder and decoder) as its own FSDP2 unit, then the root
    (embeddings, final norms, tied head), so only one block's parameters are gathered at a time."""
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.precision == "bf16"
        else MixedPrecisionPolicy()
    )
    for stack in (model.encoder, model.decoder):
        for block in stack.block:
            fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)

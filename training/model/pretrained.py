"""The check of a pretrained model directory (``--model.init_from DIR``) before anything loads it.

Torch-free (it reads file names and ``config.json`` only), so the start checks (:mod:`training.job.check`) can run
it on the launching host before any process starts; :func:`training.model.t5.build_model` runs it too. A directory
without weights is a configuration error (exit 2); weights of another model shape are exit 3, as for a training
checkpoint of another model (training.errors.CheckpointIncompatible)::

    check_pretrained_dir("/fsx/weights", cfg.model)   # raises ConfigError or CheckpointIncompatible
"""

from __future__ import annotations

import json
import os
from typing import Any

from training.config import ConfigError, ModelConfig
from training.errors import CheckpointIncompatible

CONFIG_FILE = "config.json"
#: What ``from_pretrained`` reads, whole or sharded (an index beside its shards).
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
#: The fields that decide the shape of every weight (the same as a checkpoint's signature).
SHAPE_FIELDS = ("d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "vocab_size")
#: The feed-forward of every model this project builds (T5 v1.1); another one has other weights (wi vs wi_0/wi_1).
FEED_FORWARD = "gated-gelu"
WANTED = (
    f"a directory with {CONFIG_FILE} and model.safetensors (or pytorch_model.bin), e.g. one written by "
    "python -m training.export"
)


def check_pretrained_dir(path: str, model: ModelConfig) -> None:
    """Raise ConfigError (exit 2) unless `path` is a directory with a readable config.json and weights, and
    CheckpointIncompatible (exit 3) when its config.json describes another model shape than `model`."""
    where = f"model.init_from={path!r}"
    if not os.path.isdir(path):
        raise ConfigError(f"{where} is not a local directory; pass {WANTED} (hub names are not downloaded)")
    has_config = os.path.isfile(os.path.join(path, CONFIG_FILE))
    has_weights = any(os.path.isfile(os.path.join(path, w)) for w in WEIGHT_FILES)
    if not (has_config and has_weights):
        weights = "weights (model.safetensors or pytorch_model.bin)"
        missing = (
            f"neither {CONFIG_FILE} nor {weights}"
            if not (has_config or has_weights)
            else f"no {CONFIG_FILE}"
            if not has_config
            else f"no {weights}"
        )
        raise ConfigError(f"{where} has {missing}{_checkpoint_hint(path)}; pass {WANTED}")
    differences = shape_differences(_read_config(path), model)
    if differences:
        raise CheckpointIncompatible(shape_mismatch(path, differences))


def shape_differences(theirs: dict[str, Any], model: ModelConfig) -> list[tuple[str, Any, Any]]:
    """[(field, in the directory, in this run)] for every shape field that differs. A field the directory's
    config does not set is left to transformers' default, checked again once the model is built."""
    mine = {k: getattr(model, k) for k in SHAPE_FIELDS}
    theirs = dict(theirs)
    if theirs.get("num_decoder_layers") is None and "num_layers" in theirs:
        theirs["num_decoder_layers"] = theirs["num_layers"]  # T5Config: decoder depth defaults to the encoder's
    out = [(k, theirs[k], mine[k]) for k in SHAPE_FIELDS if k in theirs and theirs[k] != mine[k]]
    ff = theirs.get("feed_forward_proj", FEED_FORWARD)
    if ff != FEED_FORWARD:
        out.append(("feed_forward_proj", ff, FEED_FORWARD))
    return out


def shape_mismatch(path: str, differences: list[tuple[str, Any, Any]]) -> str:
    """One line: which fields differ, and the two ways on (matching flags, or weights of this shape)."""
    listed = ", ".join(f"{k}={theirs!r} (this run: {mine!r})" for k, theirs, mine in differences)
    flags = " ".join(f"--model.{k} {theirs}" for k, theirs, _ in differences if k in SHAPE_FIELDS)
    only_shape = all(k in SHAPE_FIELDS for k, _, _ in differences)  # else no flag of ours builds it
    fix = f"run with its shape ({flags}) or pass" if only_shape else "pass"
    return (
        f"model.init_from={path!r} holds a model of another shape: {listed}; {fix} a directory with "
        f"{CONFIG_FILE} and weights of this run's shape (nothing was loaded)"
    )


def _read_config(path: str) -> dict[str, Any]:
    file = os.path.join(path, CONFIG_FILE)
    try:
        with open(file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.init_from={path!r}: {file} cannot be read ({e}); pass {WANTED}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"model.init_from={path!r}: {file} is not a JSON object; pass {WANTED}")
    return config


def _checkpoint_hint(path: str) -> str:
    """A training checkpoint passed where model weights belong: say which flag takes it."""
    if os.path.isfile(os.path.join(path, "COMMITTED.json")) or any(
        name.startswith("step_") for name in os.listdir(path)
    ):
        return (
            " (it is a training checkpoint: start from it with --checkpoint.initial_load_path, or export it "
            "with python -m training.export)"
        )
    return ""

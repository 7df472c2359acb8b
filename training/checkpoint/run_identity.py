"""What defines a run, recorded in every checkpoint, so a resume never silently mixes two experiments.

A resume continues *the same* training: same data (by content: another data.text_field of the same file is
other content), sample definition, seed, optimizer and
schedule, global batch. The model's shape is checked separately (a different shape cannot even load).
The world size, thread counts, timeouts and checkpoint policy may change freely.

    fp = run_fingerprint(cfg, data_label="builtin", data_digest=digest_tokens(tokens))
    changes = diff(saved_fp, fp)          # [Change("train.lr", 0.001, 0.01), ...]
    refuse_or_accept(changes, accept="train.lr", ...)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The settings a resume may change, and what each change does, live beside the settings (training.config);
# re-exported here for the fingerprint's users.
from training.config import ALWAYS_ACCEPTED, EFFECTS, FIELDS, parse_accept  # noqa: F401

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Change:
    field: str
    saved: Any
    now: Any

    def effect(self, step: int, offset: int) -> str:
        return EFFECTS.get(self.field, "applies from step {next} on").format(step=step, next=step + 1, offset=offset)


def digest_tokens(tokens: "torch.Tensor | Any") -> str:
    """Content hash of the token stream the samples are cut from (any source; renames do not matter). A prepared
    directory's stream is not read for it: ``prepare`` hashed the same bytes the same way while writing it, so
    preparing a run's data does not change its fingerprint."""
    manifest = getattr(tokens, "manifest", None)  # a prepared directory (ShardedTokens): its recorded digest
    if manifest is not None:
        return manifest.digest
    return hashlib.blake2b(tokens.contiguous().numpy().tobytes(), digest_size=8).hexdigest()


def run_fingerprint(cfg, *, data_label: str, data_digest: str) -> dict[str, Any]:
    """The run-defining values of `cfg` (a training Config). Data is identified by content digest."""
    d, t = cfg.data, cfg.train
    return {
        "data.source": {"label": data_label, "digest": data_digest},
        "data.seq_len": d.seq_len,
        "data.noise_density": d.noise_density,
        "data.mean_span_len": d.mean_span_len,
        "job.seed": cfg.job.seed,
        "train.lr": t.lr,
        "train.warmup_steps": t.warmup_steps,
        "train.steps": t.steps,
        "train.weight_decay": t.weight_decay,
        "train.max_grad_norm": t.max_grad_norm,
        "train.global_batch": t.global_batch,
        "optimizer": "AdamW(betas=(0.9, 0.95))",
    }


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "data.source" and isinstance(a, dict) and isinstance(b, dict):
        return a.get("digest") == b.get("digest")  # the label (path) may change: the content is what counts
    return a == b


def diff(saved: dict[str, Any], now: dict[str, Any]) -> list[Change]:
    """Fields whose value differs (a field the saved fingerprint lacks is not a change)."""
    return [Change(k, saved[k], now.get(k)) for k in now if k in saved and not _same(k, saved[k], now.get(k))]


def show(value: Any) -> str:
    if isinstance(value, dict) and "digest" in value:
        return f"{value['label']} (content {value['digest']})"
    return repr(value)

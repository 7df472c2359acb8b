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

if TYPE_CHECKING:  # config.py imports this module and must stay cheap (no torch at argument parsing)
    import torch

    from training.data import ShardedTokens

# Field -> what accepting a change of it does, shown in the error and when accepted. {step}: the step the
# run resumes after; {offset}: the global sample offset it continues at.
EFFECTS = {
    "data.source": "the new data is read from global sample {offset} on (its own epoch order)",
    "data.seq_len": "samples of the new length from global sample {offset} on",
    "data.noise_density": "the new span corruption applies from global sample {offset} on",
    "data.mean_span_len": "the new span corruption applies from global sample {offset} on",
    "job.seed": "the data order follows the new seed from global sample {offset} on (dropout keeps its saved state)",
    "train.lr": "the new peak learning rate applies from step {next} on (on the same warmup/decay curve)",
    "train.warmup_steps": "the learning-rate curve is recomputed with the new warmup from step {next} on",
    "train.steps": "the run ends at the new step count; the cosine decay is stretched to it from step {next} on",
    "train.weight_decay": "the new weight decay applies from step {next} on",
    "train.max_grad_norm": "the new clipping norm applies from step {next} on",
    "train.global_batch": "steps from {next} on take the new global batch; the sample offset {offset} is kept",
    "optimizer": "the saved optimizer state is used with the new optimizer settings",
}
FIELDS = tuple(EFFECTS)
# Changes a resume takes without being asked (and says so): running longer is the common, intended one.
ALWAYS_ACCEPTED = frozenset({"train.steps"})


@dataclass(frozen=True)
class Change:
    field: str
    saved: Any
    now: Any

    def effect(self, step: int, offset: int) -> str:
        return EFFECTS.get(self.field, "applies from step {next} on").format(step=step, next=step + 1,
                                                                               offset=offset)


def digest_tokens(tokens: "torch.Tensor | ShardedTokens") -> str:
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
        "data.seq_len": d.seq_len, "data.noise_density": d.noise_density, "data.mean_span_len": d.mean_span_len,
        "job.seed": cfg.job.seed,
        "train.lr": t.lr, "train.warmup_steps": t.warmup_steps, "train.steps": t.steps,
        "train.weight_decay": t.weight_decay, "train.max_grad_norm": t.max_grad_norm,
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


def parse_accept(text: str) -> set[str]:
    """'train.lr, data.source' -> {'train.lr', 'data.source'}; 'all' (alone) -> every field. Unknown names, or 'all'
    with other names, raise ValueError."""
    names = {s.strip() for s in text.split(",") if s.strip()}
    if names == {"all"}:
        return set(FIELDS)
    if "all" in names:  # 'all' already means every field: a list next to it is a mistake, not a wider 'all'
        raise ValueError(f"checkpoint.accept_changes={text!r}: 'all' cannot be combined with other fields; pass "
                         f"either all or a list of fields ({', '.join(FIELDS)})")
    unknown = sorted(names - set(FIELDS))
    if unknown:
        raise ValueError(f"checkpoint.accept_changes: unknown field(s) {', '.join(unknown)}; "
                         f"valid: all, {', '.join(FIELDS)}")
    return names

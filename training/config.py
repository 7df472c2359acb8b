"""Typed job configuration: defaults < TOML preset < --config file < CLI flags.

Every field is documented in place; `python -m training --help` prints those docs. Each component
receives only its own slice (``cfg.model``, ``cfg.checkpoint``, ...). All cross-field checks live in
:func:`validate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import math
import os
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# MEMORY_DIR_ENV: re-exported for the rooms that read the memory directory (checkpoint, launch, chaos)
from cluster_facts import MEMORY_DIR_ENV, NODE_MEMORY_DIR  # noqa: F401
from training.field_docs import field_docs

PRESET_DIR = Path(__file__).parent / "presets"


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the value and the fix."""


# ---- The resume guard's vocabulary (training.checkpoint.run_identity): which run settings a resume may change.
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


def parse_accept(text: str) -> set[str]:
    """'train.lr, data.source' -> {'train.lr', 'data.source'}; 'all' (alone) -> every field. Unknown names, or 'all'
    with other names, raise ValueError."""
    names = {s.strip() for s in text.split(",") if s.strip()}
    if names == {"all"}:
        return set(FIELDS)
    if "all" in names:  # 'all' already means every field: a list next to it is a mistake, not a wider 'all'
        raise ValueError(
            f"checkpoint.accept_changes={text!r}: 'all' cannot be combined with other fields; pass "
            f"either all or a list of fields ({', '.join(FIELDS)})"
        )
    unknown = sorted(names - set(FIELDS))
    if unknown:
        raise ValueError(
            f"checkpoint.accept_changes: unknown field(s) {', '.join(unknown)}; valid: all, {', '.join(FIELDS)}"
        )
    return names


@dataclass
class JobConfig:
    out_dir: str = ""
    """Run directory for checkpoints and metrics. Empty: runs/<preset>."""
    seed: int = 1234
    """Seed for model init (identical on every rank), data order and dropout."""


@dataclass
class ModelConfig:
    d_model: int = 256
    """Hidden size."""
    d_kv: int = 32
    """Size of each attention head's key/value projection."""
    d_ff: int = 1024
    """Feed-forward inner size (gated-GELU)."""
    num_layers: int = 4
    """Encoder blocks."""
    num_decoder_layers: int = 4
    """Decoder blocks."""
    num_heads: int = 8
    """Attention heads."""
    vocab_size: int = 384
    """Vocabulary size; 384 = the byte-level (ByT5) vocabulary the built-in tokenizer uses."""
    dropout: float = 0.1
    """Dropout rate (randomness is seeded per rank and checkpointed)."""
    init_from: str = ""
    """Optional local directory with pretrained T5 weights (e.g. on FSx). Never a hub name."""
    attention: str = "sdpa"
    """Attention kernel: 'sdpa' (transformers' SDPA path), 'eager', or 'sdpa_bias' (training/model/attention.py: SDPA
    given T5's learned position bias in the compute dtype with the mask folded in, scale 1.0, and no bias at all
    in cross-attention, so the fused kernels can run; not yet measured on a GPU), or 'flex' (training/model/flex.py:
    FlexAttention, compiled on CUDA, with the position bias as a score_mod and the causal/padding masks as a block
    mask, so no score tensor is materialised; needs model.dropout 0; not yet measured on a GPU). 'eager' was 14%
    faster and used 8 GiB less than 'sdpa' for t5-large on an H100, so the GPU presets use it. Same weights and
    checkpoints with every kernel."""


@dataclass
class DataConfig:
    source: str = "builtin"
    """'builtin' (offline corpus of real English text: the Python standard library's documentation
    strings, present wherever Python is), a path to a .jsonl / .parquet file or a directory of them (read into
    every rank's memory), or a prepared directory (memory-mapped: any size; made once with `python -m
    training.data prepare SRC DST`, and the same samples as data.source=SRC)."""
    text_field: str = "text"
    """Field holding the text in JSONL/Parquet records."""
    seq_len: int = 128
    """Encoder input length in tokens (after span corruption)."""
    noise_density: float = 0.15
    """Fraction of tokens masked by T5 span corruption."""
    mean_span_len: float = 3.0
    """Mean length of a masked span."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0 = in the training process)."""


@dataclass
class TrainConfig:
    steps: int = 60
    """Total optimizer steps."""
    global_batch: int = 8
    """Samples per step across all ranks; fixed when the world size changes (must divide by it)."""
    micro_batch: int = 0
    """Most samples a rank puts through one forward/backward. A larger per-rank share (global_batch / world
    size, which grows when a node is lost and the job continues smaller) is split into micro-batches whose
    gradients are accumulated, so GPU memory stays what the full-size job needed. 0 = no limit. `python -m
    training.batch_fit` picks it from memory measured on the GPU for the launcher's MIN..MAX nodes."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 10
    """Linear warmup steps, then cosine decay to 10% of lr at `steps`."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    adamw_impl: str = "fused"
    """AdamW's implementation (training/job/optimizer.py): 'fused' (one kernel for all parameters), 'foreach'
    (multi-tensor ops) or 'for_loop' (one parameter at a time). Same maths, only the rounding differs, so a resume
    may change it; not yet compared on a GPU (scripts/bench_gpu.sh, row adamw-foreach)."""
    max_bad_steps: int = 1
    """Stop (exit 5) after this many steps in a row with a non-finite loss or gradient norm. Such a step's
    update is skipped and it is never checkpointed, so the last good checkpoints are kept."""


@dataclass
class ParallelConfig:
    device: str = "auto"
    """'cpu', 'cuda' or 'auto' (cuda when available)."""
    precision: str = "fp32"
    """'fp32' or 'bf16' (bf16 parameters/compute with fp32 gradient reduction; use on GPU)."""
    activation_checkpointing: bool = False
    """Recompute each T5 block's activations in the backward pass to save memory."""
    compile: str = "auto"
    """torch.compile each T5 block in place before sharding (training/model/compile.py): 'on', 'off', or 'auto' = off
    for now (on the CPU compiling costs more than the small models' steps; on GPUs it stays off until a run
    measures a gain)."""
    compile_cache_dir: str = ""
    """With compile on: where rank 0 keeps torch's portable compile artefacts after its first step, one file per
    cache key (model and parallel settings, device, torch version, model code: a change never loads a stale one),
    so a restart on a node that has not compiled yet (a replacement) skips most of the compile; each node also keeps
    Inductor's caches in a node-local directory per key (training/model/compile_cache.py). Empty:
    <out_dir>/compile-cache (shared storage on clusters); 'off': nothing kept or loaded."""
    threads: int = 1
    """Intra-op CPU threads per process (torchrun does not set this with one process per node)."""
    deterministic: bool = False
    """Deterministic kernels (torch.use_deterministic_algorithms, cuDNN deterministic without autotuning, a fixed
    cuBLAS workspace): on GPUs two runs, or a run and its resume, can then be compared bitwise where the kernels
    allow it; an op without a deterministic kernel stops the run naming it. Costs speed on GPUs (see
    docs/failover.md). CPU runs are deterministic either way."""
    init_timeout_s: float = 300.0
    """Process-group timeout until the first step completes (rendezvous, checkpoint load). 10 s to 604800 s
    (7 days)."""
    train_timeout_s: float = 60.0
    """Process-group timeout after the first step: how long a collective waits for a hung or vanished
    peer before the job fails and restarts (the defaults would wait 10-30 minutes). 1 s to 604800 s (7 days)."""
    heartbeat_timeout_s: float = 10.0
    """A peer whose heartbeat (a thread in every worker, once a second, in the rendezvous store) has not moved
    for this long is declared silent (a node that lost power, a partition, a stopped or wedged worker): its
    watcher ends its own worker, and the silent worker's own agent SIGKILLs it (when the agent still runs), so
    the job re-forms in seconds instead of after train_timeout_s. Heartbeats come from a thread, so slow steps
    and long saves never look silent. 0 = off, else 3 s to 604800 s (7 days); see training/job/watchdog.py."""
    wedge_floor_s: float = 10.0
    """A rank whose main thread stays in one phase of a step (data, forward_backward, optimizer, snapshot,
    checkpoint) longer than that phase's bound, outside any collective, is wedged: it says so in one line and its
    agent SIGKILLs it, so the job restarts instead of waiting train_timeout_s. The bound is max(this, wedge_multiple
    x the slowest time of the phase seen in this attempt); the checkpoint phase's is at least
    checkpoint.min_timeout_s; the synchronous save of a stop or of the last step may take init_timeout_s. Runs on
    the heartbeat thread: off when heartbeat_timeout_s is 0 or with one process. 0 = off, else 3 s to 604800 s
    (7 days) and below train_timeout_s (see training/job/progress.py)."""
    wedge_multiple: float = 4.0
    """The wedge bound of a phase, and half the process-group timeout after the warm-up, is this many times the
    slowest time observed (of the phase; of a whole step), at least wedge_floor_s."""
    wedge_warmup: int = 3
    """A phase seen fewer times than this in an attempt (the first steps: caches, compilation, the first save),
    and everything before step 1 (build, load), may take init_timeout_s; the process-group timeout follows the
    observed steps after this many steps (train_timeout_s until then, the most it ever is). Each phase's first
    time is not used as a measure (it pays one-time costs)."""


@dataclass
class StragglerConfig:
    """Straggler detection (training/job/stragglers.py): every step each rank times its own work (the forward
    compute of its FSDP blocks, the parameter all-gathers where it waits for peers excluded, and its optimizer step)
    and the ranks compare the times in one small all-gather. A rank at least `factor` x the median of the others in
    `steps` (M) of its last 2M-1 steps, the latest among them, is named (a `straggler` event); with a hot spare
    waiting, its node leaves the job at that step boundary, after the step's in-memory snapshot, and the spare takes
    its place."""

    factor: float = 2.0
    """k: a rank whose work time is at least this many times the median of the other ranks' is slow this step.
    Measured on the debug preset, 2 CPU processes on a shared 2-core machine: ordinary steps differ by at most
    1.24x; a process stopped 0.2 s of every 0.3 s reads 1.5-4.3x, median 2.8-2.9x (docs/failover.md). 0 = off."""
    steps: int = 3
    """M: slow steps among the rank's last 2M-1 before it is named, the latest step slow (a single slow step is
    noise: a page fault burst, another process on the core; M in a row was the rule before, but a rank slowed part
    of the time reads below `factor` in some steps and reset the count: named after 3-8 slowed steps)."""
    skip_steps: int = 2
    """Steps after each start that are not judged (the first steps warm caches, compile, restore)."""
    evict_window_s: float = 600.0
    """At most one node taken out per this many seconds (an eviction storm guard; the time is kept in
    <out_dir>/.straggler-taken-out across restarts). 0 = never take a node out: name it only. At most 604800 s
    (7 days)."""


@dataclass
class FailoverConfig:
    """In-process recovery (issue #52, docs/inprocess.md): when a peer's process dies, the surviving ranks keep
    their processes, agree the new membership and the step to resume at through the job's etcd (``T5_ETCD_*``),
    build a new process group, restore the agreed step from the in-memory snapshots and go on. Anything that cannot
    be agreed within ``in_place_bound_s`` ends the process as without it (a full restart)."""

    in_place: bool = False
    """On: survivors recover in their own process (needs the job's etcd and checkpoint.memory_interval > 0).
    Off (the default): a peer's death ends every worker and the agent restarts the group (docs/failover.md)."""
    in_place_min_world: int = 0
    """The fewest ranks a re-formed group may train with. 0: the world size the workers started with (survivors
    wait, up to in_place_bound_s, for a replacement of the lost rank, so the run stays bitwise what an
    uninterrupted one gives); smaller: they may go on without it at a smaller world size (shards re-cut)."""
    in_place_bound_s: float = 10.0
    """Seconds the survivors wait for the agreement and the new group (and for the replacement) before they fall
    back to a full restart from the newest complete snapshot. Above 1 s, at most 604800 s (7 days)."""


# Where in-memory snapshots live (training.checkpoint.memory): node-local tmpfs; the local launcher gives each
# simulated node its own directory through MEMORY_DIR_ENV (EKS points it at the node's copy, see the runtime).
DEFAULT_MEMORY_DIR = NODE_MEMORY_DIR


@dataclass
class CheckpointConfig:
    dir: str = ""
    """Checkpoint directory (shared storage on clusters). Empty: <out_dir>/checkpoints."""
    interval: int = 10
    """Save every this many steps (the final step and a signal always save)."""
    keep_last: int = 3
    """Complete checkpoints to keep; older ones are deleted after a newer one commits."""
    async_save: bool = True
    """Write checkpoints in the background (training continues after a short copy)."""
    writer: str = "thread"
    """Where async saves are written: 'thread' (a thread of the training process, which shares its interpreter lock)
    or 'process' (a writer process per rank, started once before the first step; the training process only copies
    the state into reused shared-memory buffers, not page-locked on GPUs). On a 2-core CPU machine the process gave
    steps no faster during a write (`make bench`); it is meant for GPU nodes, where it is not measured yet."""
    timeout_s: float = 3600.0
    """Timeout of the checkpoint collectives (their own gloo group) until a save has been timed: how long the
    load and the first save wait for the slowest rank's read or write before they fail. Also the most any
    later save waits (see min_timeout_s). At most 604800 s (7 days)."""
    min_timeout_s: float = 60.0
    """Once a save has been timed, the checkpoint collectives wait max(this, 4 x the slowest save so far), at
    most timeout_s: a peer that goes silent mid-save (its sockets stay open) costs that long, not timeout_s.
    The in-memory snapshots' collectives (node memory, one peer) wait this long. Above 0, at most timeout_s
    (and 604800 s, 7 days)."""
    load_step: int = 0
    """Resume from this step's checkpoint instead of the newest (0 = newest). Newer checkpoints are moved to
    <dir>/superseded/ (kept, never overwritten); later restarts of the same run resume from the newest again."""
    initial_load_path: str = ""
    """Start a new run from another run's model weights (a step_NNNNNNNN directory or a checkpoint.dir: its
    newest complete checkpoint). Only used when this run has no checkpoint yet (a resume says it is not used);
    optimizer, schedule and data start fresh. The model shape must match (exit 3 otherwise); a damaged one is
    refused (exit 2)."""
    memory_interval: int | str = "auto"
    """In-memory snapshot every this many steps, 'auto' (the default), or 0 (off): each rank copies its shard of the
    whole training state into node-local shared memory (and a peer node's, see memory_replica) on a background
    thread, so a failure costs at most the interval's steps (the one in flight included). 'auto' measures what a
    snapshot blocks training (capturing the state and waiting for its copy) and the step time, and takes the
    smallest interval within memory_budget, at most checkpoint.interval (rarer would bound lost work no better
    than storage); the first snapshots of an attempt are taken every step to measure, and it is re-measured as
    conditions change (a slower node, another world size). The log says what it chose, and again when it changes.
    A number is kept as given; if it costs more than memory_budget the log says so once, with what 'auto' would
    take. A restart restores from memory when some node still holds every shard of a step newer than the newest
    storage checkpoint (re-cut to the new shards if the world size changed); else from storage. A node without
    room for them turns the tier off with a warning."""
    memory_budget: float = 0.02
    """The share of training time in-memory snapshots may block (0.02 = 2%): memory_interval='auto' keeps within
    it; a fixed memory_interval over it is reported once. Above 0 and below 1."""
    memory_dir: str = ""
    """Node-local directory for the snapshots (tmpfs). Empty: $T5F_MEMORY_DIR, else /dev/shm/t5-failover. An
    absolute path: a relative one is refused (it would put the snapshots on disk under the current directory)."""
    memory_replica: bool = True
    """Also keep each node's snapshot in the next node's memory (a ring over the ranks with the same local
    rank), so losing a whole node loses no snapshot. Needs 2+ nodes; two adjacent nodes lost at once fall
    back to storage."""
    accept_changes: str = ""
    """Resume even though these run settings differ from the checkpoint's (comma-separated, e.g.
    'train.lr,data.source', or 'all'); each change then applies from the resumed step on. Empty: a resume
    with changed settings stops (exit 4) and lists them. The world size may always change."""


@dataclass
class MetricsConfig:
    path: str = ""
    """Per-step metrics JSONL (rank 0, appended across restarts). Empty: <out_dir>/metrics.jsonl."""
    log_every: int = 1
    """Print a progress line every this many steps."""
    tensorboard: bool = True
    """Also write the metrics as TensorBoard event files (loss, lr, grad norm, tokens/s, step time, world size,
    a marker per restart and failure; rank 0, on a background thread that never blocks a step). false: none."""
    tensorboard_dir: str = ""
    """Where the TensorBoard event files go (tensorboard --logdir DIR). Empty: <out_dir>/tensorboard."""


@dataclass
class FaultConfig:
    """Fault-injection hooks for tests and chaos runs; all off by default."""

    sigkill_at_step: int = 0
    """If > 0: rank `fault.rank` SIGKILLs itself right after this step (once per out_dir)."""
    rank: int = 0
    """Rank that `sigkill_at_step` kills."""
    slow_commit_s: float = 0.0
    """Sleep this long after a checkpoint's data is written and before its commit marker (at most 604800 s)."""
    step_sleep_s: float = 0.0
    """Sleep this long after every step, on every rank: stretches a short chaos job so that a rejoining node
    is admitted before the job ends. Changes wall time only, never the math. At most 604800 s (7 days)."""
    hold_file: str = ""
    """If set: while this file exists, every rank waits after each step (looking every 0.1 s) before the next.
    A chaos harness creates it to hold a short job at a step boundary until a rejoining node is admitted, and
    removes it once the job trains at full size again, so the job cannot end first however slow the machine.
    Changes wall time only, never the math."""
    nan_at_step: int = 0
    """If > 0: the loss of this step is made NaN on every rank (tests the non-finite guard)."""
    fail_snapshot_at_step: int = 0
    """If > 0: rank `fault.rank`'s in-memory snapshot of this step fails (an injected "no space" error): every
    rank must turn the tier off at the next step and train on with storage checkpoints."""
    stop_at_step: int = 0
    """If > 0: rank `fault.rank` stops itself (SIGSTOP: alive, sockets open, silent) right after this step
    (once per out_dir): the peers' heartbeat watchdog must notice (parallel.heartbeat_timeout_s)."""
    stop_in_save_at_step: int = 0
    """If > 0: rank `fault.rank` stops itself (SIGSTOP, as a node that goes silent: its sockets stay open) at the
    start of this step's checkpoint write (once per out_dir): its peers must give up after the checkpoint
    collectives' bound (checkpoint.min_timeout_s), not checkpoint.timeout_s."""
    sigkill_after_snapshot_at_step: int = 0
    """If > 0: rank `fault.rank` SIGKILLs itself right after this step once its in-memory snapshot of the step is
    written (once per out_dir): its shard of the step is on its node, so the survivors of an in-place recovery
    resume at the step they hold (with `sigkill_at_step` the copy may still be running: one step back)."""
    kill_in_snapshot_at_step: int = 0
    """If > 0: rank `fault.rank` SIGKILLs itself halfway through copying this step's in-memory snapshot
    (once per out_dir): the previous snapshot must be the one restored."""
    wedge_at_step: int = 0
    """If > 0: rank `fault.rank` blocks its main thread for good at the start of this step's forward pass (once
    per out_dir); its process and heartbeat thread run on, as with a hung file-system read: its wedge verdict
    (parallel.wedge_floor_s) must end it, not the process-group timeout."""


@dataclass
class Config:
    preset: str = "debug"
    """Preset the values started from (training/presets/<name>.toml)."""
    job: JobConfig = field(default_factory=JobConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = [f.name for f in fields(Config) if f.name != "preset"]


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _coerce(value: Any, typ: type, name: str) -> Any:
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a valid {typ.__name__}") from None


def _apply(cfg: Config, section: str, key: str, value: Any, origin: str) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"unknown config section [{section}] in {origin}; valid: {', '.join(SECTIONS)}")
    sub = getattr(cfg, section)
    types = {f.name: f.type for f in fields(sub)}
    if key not in types:
        raise ConfigError(
            f"unknown option {section}.{key} in {origin}; valid: " + ", ".join(f"{section}.{k}" for k in types)
        )
    if types[key] == "int | str":  # a number or a word (memory_interval: 3 or auto); validate() judges the word
        setattr(sub, key, _int_or_word(value))
        return
    typ = {"int": int, "float": float, "str": str, "bool": bool}[types[key]]
    setattr(sub, key, _coerce(value, typ, f"{section}.{key}"))


def _int_or_word(value: Any) -> int | str:
    """'3' or 3 -> 3; anything else stays as it came (a word such as 'auto', or a mistake validate() names)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return str(value).strip().lower()


def _apply_toml(cfg: Config, path: Path) -> None:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [section] table")
        for key, value in values.items():
            _apply(cfg, section, key, value, str(path))


class _Parser(argparse.ArgumentParser):
    """Reports a bad flag as a ConfigError (one message, the closest valid flag suggested), not a usage dump."""

    def error(self, message: str):
        raise ConfigError(message)


def _preset_defaults(preset: str) -> Config:
    cfg = Config(preset=preset)
    preset_path = PRESET_DIR / f"{preset}.toml"
    if not preset_path.is_file():
        raise ConfigError(f"unknown preset {preset!r}; choose one of: {', '.join(presets())}")
    _apply_toml(cfg, preset_path)
    return cfg


def _group_doc(cls: type) -> str | None:
    doc = cls.__doc__ or ""
    return None if doc.startswith(cls.__name__ + "(") else inspect.getdoc(cls)  # dataclasses invent a repr-doc


def build_arg_parser(preset: str = "debug") -> argparse.ArgumentParser:
    """The CLI; each flag's help shows the value `preset` gives it (what will run without the flag)."""
    p = _Parser(
        prog="python -m training",
        allow_abbrev=False,
        description=(
            "FSDP2 T5 training with exact checkpoint resume. Values come from the defaults, then the "
            "preset, then --config, then the --section.field flags below. Resumes automatically from "
            "the newest complete checkpoint in checkpoint.dir. Launch with torchrun."
        ),
    )
    p.add_argument("--preset", default="debug", help=f"preset: one of {', '.join(presets())} (default: debug)")
    p.add_argument("--config", default=None, help="TOML file with [section] tables, applied after the preset")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as TOML (usable as --config) and exit",
    )
    defaults = _preset_defaults(preset)
    for section in SECTIONS:
        sub = getattr(defaults, section)
        g = p.add_argument_group(section, _group_doc(type(sub)))
        docs = field_docs(type(sub))
        for f in fields(sub):
            g.add_argument(
                f"--{section}.{f.name}",
                dest=f"{section}.{f.name}",
                default=None,
                metavar=f.type.upper().replace(" ", ""),
                help=f"{docs.get(f.name, '')} ({preset}: {getattr(sub, f.name)!r})".replace("%", "%%"),
            )
    return p


def _flags() -> list[str]:
    return ["--preset", "--config", "--print-config"] + [
        f"--{s}.{f.name}" for s in SECTIONS for f in fields(getattr(Config(), s))
    ]


def _suggest(unknown: list[str]) -> str:
    flag = unknown[0].split("=", 1)[0]
    close = difflib.get_close_matches(flag, _flags(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; python -m training --help lists them"
    return f"unknown option {flag}{hint}"


def parse_args(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    """Parse CLI args into a validated Config (defaults < preset < --config < flags) and the raw namespace."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = _Parser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default="debug")
    preset = pre.parse_known_args(argv)[0].preset
    parser = build_arg_parser(preset if (PRESET_DIR / f"{preset}.toml").is_file() else "debug")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(_suggest(unknown))
    cfg = _preset_defaults(args.preset)
    if args.config:
        _apply_toml(cfg, Path(args.config))
    for name, value in vars(args).items():
        if "." in name and value is not None:
            section, key = name.split(".", 1)
            _apply(cfg, section, key, value, "command line")
    return finalize(cfg), args


def load_config(argv: list[str] | None = None) -> Config:
    """Parse CLI args into a validated Config (defaults < preset < --config < flags)."""
    return parse_args(argv)[0]


def to_toml(cfg: Config) -> str:
    """The whole configuration as TOML that ``--config`` reads back to the same values."""
    lines = [f"# resolved configuration (preset {cfg.preset!r}); python -m training --config THIS reproduces it"]
    for section in SECTIONS:
        lines.append(f"\n[{section}]")
        for f in fields(getattr(cfg, section)):
            v = getattr(getattr(cfg, section), f.name)
            lines.append(f"{f.name} = {json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)}")
    return "\n".join(lines) + "\n"


def finalize(cfg: Config) -> Config:
    """Fill derived defaults (paths) and validate."""
    if not cfg.job.out_dir:
        cfg.job.out_dir = os.path.join("runs", cfg.preset)
    if not cfg.checkpoint.dir:
        cfg.checkpoint.dir = os.path.join(cfg.job.out_dir, "checkpoints")
    if not cfg.parallel.compile_cache_dir:
        cfg.parallel.compile_cache_dir = os.path.join(cfg.job.out_dir, "compile-cache")
    if not cfg.metrics.path:
        cfg.metrics.path = os.path.join(cfg.job.out_dir, "metrics.jsonl")
    if not cfg.metrics.tensorboard_dir:
        cfg.metrics.tensorboard_dir = os.path.join(cfg.job.out_dir, "tensorboard")
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Every check of the values, in one place. What they point at (files, directories, GPUs) is checked by
    training.job.check on the host that runs the job; world-size checks at start (see check_world)."""
    m, d, t, p, c = cfg.model, cfg.data, cfg.train, cfg.parallel, cfg.checkpoint

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    for section in SECTIONS:  # inf and nan pass comparisons like "> 0", then fail deep inside (timedelta(inf))
        for f in fields(getattr(cfg, section)):
            v = getattr(getattr(cfg, section), f.name)
            need(
                not isinstance(v, float) or math.isfinite(v),
                f"{section}.{f.name}={v} must be a finite number (--{section}.{f.name})",
            )
            # every *_s field is a wait: timedelta, torch's C++ clocks and time.sleep overflow long before a float
            if f.name.endswith("_s") and v > MAX_WAIT_S:
                raise ConfigError(
                    f"{section}.{f.name}={_seconds(v)} must be at most {MAX_WAIT_S:g} s "
                    f"({MAX_WAIT_S / 86400:g} days): longer waits overflow Python's and torch's "
                    f"timers; use --{section}.{f.name} {MAX_WAIT_S:g} or less"
                )
    for name in ("d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads"):
        need(getattr(m, name) > 0, f"model.{name}={getattr(m, name)} must be > 0")
    need(m.vocab_size >= 384, f"model.vocab_size={m.vocab_size} is too small for the byte tokenizer; use >= 384")
    need(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
    need(
        m.attention in ("sdpa", "eager", "sdpa_bias", "flex"),
        f"model.attention={m.attention!r}: use sdpa, eager, sdpa_bias or flex",
    )
    need(
        m.attention != "flex" or m.dropout == 0.0,
        f"model.dropout={m.dropout} with model.attention=flex: FlexAttention has no attention dropout; "
        "use --model.dropout 0 or another kernel",
    )
    need(d.seq_len >= 16, f"data.seq_len={d.seq_len} must be >= 16")
    need(0.0 < d.noise_density < 0.5, f"data.noise_density={d.noise_density} must be in (0, 0.5)")
    need(d.mean_span_len >= 1.0, f"data.mean_span_len={d.mean_span_len} must be >= 1")
    need(d.num_workers >= 0, f"data.num_workers={d.num_workers} must be >= 0")
    need(t.steps > 0, f"train.steps={t.steps} must be > 0")
    need(t.global_batch > 0, f"train.global_batch={t.global_batch} must be > 0")
    need(t.micro_batch >= 0, f"train.micro_batch={t.micro_batch} must be >= 0 (0 = no limit)")
    need(t.lr > 0, f"train.lr={t.lr} must be > 0")
    need(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    need(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay} must be >= 0")
    need(t.max_grad_norm >= 0, f"train.max_grad_norm={t.max_grad_norm} must be >= 0 (0 disables)")
    need(
        t.adamw_impl in ("fused", "foreach", "for_loop"),
        f"train.adamw_impl={t.adamw_impl!r}: use fused, foreach or for_loop",
    )
    need(t.max_bad_steps >= 1, f"train.max_bad_steps={t.max_bad_steps} must be >= 1")
    need(math.isfinite(t.lr), f"train.lr={t.lr} must be finite")
    need(p.device in ("auto", "cpu", "cuda"), f"parallel.device={p.device!r}: use auto, cpu or cuda")
    need(p.precision in ("fp32", "bf16"), f"parallel.precision={p.precision!r}: use fp32 or bf16")
    need(p.compile in ("auto", "on", "off"), f"parallel.compile={p.compile!r}: use auto, on or off")
    need(p.threads >= 1, f"parallel.threads={p.threads} must be >= 1")
    need(
        p.init_timeout_s >= MIN_INIT_TIMEOUT_S,
        f"parallel.init_timeout_s={p.init_timeout_s} must be >= {MIN_INIT_TIMEOUT_S:g} s: it covers the rendezvous "
        "and the checkpoint load, which take seconds even for small models",
    )
    need(
        p.train_timeout_s >= MIN_TRAIN_TIMEOUT_S,
        f"parallel.train_timeout_s={p.train_timeout_s} must be >= {MIN_TRAIN_TIMEOUT_S:g} s: every collective waits "
        "that long for the slowest rank, so below it ordinary steps time out and the job restarts in a loop "
        "(a hung peer is what it is for: 20-300 s in the presets)",
    )
    need(
        p.heartbeat_timeout_s == 0 or p.heartbeat_timeout_s >= 3,
        f"parallel.heartbeat_timeout_s={p.heartbeat_timeout_s} must be 0 (off) or >= 3 (heartbeats come every second)",
    )
    need(
        p.wedge_floor_s == 0 or p.wedge_floor_s >= 3,
        f"parallel.wedge_floor_s={p.wedge_floor_s} must be 0 (off) or >= 3 (the main thread is looked at every second)",
    )
    need(
        p.wedge_multiple >= 1.5,
        f"parallel.wedge_multiple={p.wedge_multiple} must be >= 1.5: a phase that takes a "
        "little longer than its slowest so far is not wedged",
    )
    need(
        p.wedge_warmup >= 2,
        f"parallel.wedge_warmup={p.wedge_warmup} must be >= 2 (a phase's first time, which pays "
        "one-time costs, is not a measure of the next)",
    )
    # The process-group timeout ends every wait at train_timeout_s: a wedge bound at or above it is never reached
    need(
        p.wedge_floor_s < p.train_timeout_s or p.wedge_floor_s == 0 or p.heartbeat_timeout_s == 0,
        f"parallel.wedge_floor_s={p.wedge_floor_s} must be below parallel.train_timeout_s={p.train_timeout_s} (a "
        "peer's collective would give up first); lower --parallel.wedge_floor_s or set it to 0 (off)",
    )
    need(c.interval > 0, f"checkpoint.interval={c.interval} must be > 0")
    need(
        c.memory_interval == "auto" or (isinstance(c.memory_interval, int) and c.memory_interval >= 0),
        f"checkpoint.memory_interval={c.memory_interval!r} is not valid: use auto (the default: within "
        "checkpoint.memory_budget), a number of steps, or 0 (off); e.g. --checkpoint.memory_interval auto",
    )
    need(
        0 < c.memory_budget < 1,
        f"checkpoint.memory_budget={c.memory_budget} must be above 0 and below 1 (a share "
        "of training time: 0.02 = 2%); e.g. --checkpoint.memory_budget 0.02",
    )
    # A relative path resolves against wherever the job was started (the checkout): snapshots on disk, not in memory
    need(
        not c.memory_dir or os.path.isabs(c.memory_dir),
        f"checkpoint.memory_dir={c.memory_dir!r} is a relative path: the snapshots must be on node-local shared "
        f"memory; pass an absolute tmpfs path (e.g. --checkpoint.memory_dir {DEFAULT_MEMORY_DIR}) or leave it empty",
    )
    need(
        c.writer in ("thread", "process"),
        f"checkpoint.writer={c.writer!r} is not valid: use process (a writer process per rank) or thread (a "
        "thread of the training process); e.g. --checkpoint.writer process",
    )
    need(c.timeout_s > 0, f"checkpoint.timeout_s={c.timeout_s} must be > 0")
    need(
        0 < c.min_timeout_s <= c.timeout_s,
        f"checkpoint.min_timeout_s={c.min_timeout_s} must be > 0 and at most checkpoint.timeout_s={c.timeout_s}",
    )
    try:
        parse_accept(c.accept_changes)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    need(c.load_step >= 0, f"checkpoint.load_step={c.load_step} must be >= 0 (0 = the newest)")
    need(c.keep_last >= 1, f"checkpoint.keep_last={c.keep_last} must be >= 1 (the newest is needed to resume)")
    need(cfg.metrics.log_every >= 1, f"metrics.log_every={cfg.metrics.log_every} must be >= 1")
    need(
        cfg.fault.sigkill_at_step >= 0
        and cfg.fault.rank >= 0
        and cfg.fault.slow_commit_s >= 0
        and cfg.fault.nan_at_step >= 0
        and cfg.fault.kill_in_snapshot_at_step >= 0
        and cfg.fault.fail_snapshot_at_step >= 0
        and cfg.fault.stop_at_step >= 0
        and cfg.fault.stop_in_save_at_step >= 0
        and cfg.fault.step_sleep_s >= 0
        and cfg.fault.wedge_at_step >= 0,
        "fault.* values must be >= 0",
    )
    sg = cfg.straggler
    need(
        sg.factor == 0 or sg.factor > 1,
        f"straggler.factor={sg.factor} must be 0 (off) or > 1 (a multiple of the others' median work time)",
    )
    need(sg.steps >= 1, f"straggler.steps={sg.steps} must be >= 1")
    need(sg.skip_steps >= 0, f"straggler.skip_steps={sg.skip_steps} must be >= 0")
    need(sg.evict_window_s >= 0, f"straggler.evict_window_s={sg.evict_window_s} must be >= 0 (0 = never take out)")
    fo = cfg.failover
    need(
        fo.in_place_min_world >= 0,
        f"failover.in_place_min_world={fo.in_place_min_world} must be >= 0 (0 = the starting world size)",
    )
    need(
        fo.in_place_bound_s > 1.0,
        f"failover.in_place_bound_s={_seconds(fo.in_place_bound_s)} must be above 1 s (the agreement waits 1 s "
        "for a lost member nobody reported), e.g. 10",
    )
    need(
        not fo.in_place or bool(cfg.checkpoint.memory_interval),
        "failover.in_place needs the in-memory snapshots it restores from: set checkpoint.memory_interval to 1 "
        "(or auto), or turn failover.in_place off",
    )


# Floors of the process-group timeouts (seconds): below them ordinary waits time out (see validate).
MIN_INIT_TIMEOUT_S = 10.0
MIN_TRAIN_TIMEOUT_S = 1.0
# The longest any *_s setting may be (seconds). A process-group timeout of 1e15 s passed the checks, then
# timedelta() raised OverflowError at step 1 on every rank and the job restarted into it; torch's C++ clocks
# (int64 microseconds, and nanoseconds once added to now) and time.sleep give out past ~292 years. A week
# is far below all of them and longer than any wait a job means (a hung peer, a save, a chaos hold).
MAX_WAIT_S = 7 * 24 * 3600.0


def _seconds(v: float) -> str:
    """1e15 as 1e+15, not 1000000000000000.0; but 604800.5 in full (a rounded value would look allowed)."""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def check_world(cfg: Config, world_size: int) -> None:
    """Checks that need the world size, run once the process group exists."""
    if cfg.train.global_batch % world_size:
        raise ConfigError(
            f"train.global_batch={cfg.train.global_batch} is not divisible by the world size {world_size}; "
            f"pick a global batch that every world size the job may run at divides (e.g. "
            f"{world_size * max(1, cfg.train.global_batch // world_size)})"
        )
    if (cfg.fault.sigkill_at_step or cfg.fault.wedge_at_step) and cfg.fault.rank >= world_size:
        raise ConfigError(f"fault.rank={cfg.fault.rank} >= world size {world_size}")

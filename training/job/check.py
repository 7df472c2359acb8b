"""The checks of a job's surroundings before any process starts: data, output locations, device.

:func:`training.config.validate` checks the values themselves; this checks what they point at, on the host
that runs the check, so a missing file, an empty or malformed corpus, a read-only directory or a GPU preset
on a machine without one is one line and an exit code in seconds, not a traceback per rank after the
process group formed. Every start path runs it once: the torchrun agent (``make train`` and every cluster
launch, :mod:`training.launch.agent`), the local multi-node launcher, the Slurm submit (which shares the
cluster's storage) and ``python -m training`` itself when nothing before it did::

    check_job(cfg, nproc_per_node=2)             # raises one of CHECK_ERRORS: ConfigError (exit 2) or
                                                 # CheckpointIncompatible (3: init_from of another model shape)
    check_job(cfg, data=False, locations=False)  # a submit host that cannot see the pods' files

Torch is imported only to look for GPUs (``parallel.device=cuda``).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Callable

from training.checkpoint.layout import PROBE, nesting_problem
from training.config import Config, ConfigError, DataConfig, ParallelConfig
from training.data.corpus import FIX, DataSourceError, data_files, iter_texts, raw_length_for, token_count
from training.errors import CheckpointIncompatible
from training.checkpoint.integrity import storage_reason
from training.data.prepared import TOKEN_BYTES, is_prepared, read_manifest
from training.model.pretrained import check_pretrained_dir

# Set once a launcher checked the job, so the agents and workers it starts do not scan the data again
# (a restarted worker is on the recovery path: seconds count there).
DONE_ENV = "T5F_JOB_CHECKED"
# Corpora up to this size are read completely (every record's format and field); larger ones have the first
# HEAD_RECORDS records of every file read, and then only as many as one global batch needs.
FULL_SCAN_BYTES = 256 * 2**20
HEAD_RECORDS = 1000
#: What check_job raises: each prints as one line with its exit code (training.errors).
CHECK_ERRORS = (ConfigError, CheckpointIncompatible)
PROGRESS_BYTES = 64 * 2**20
PROBE_BYTES = 4096  # what the start writes (and removes) in each location: a full file system fails it


@dataclass(frozen=True)
class CorpusFacts:
    files: int
    bytes: int
    documents: int
    tokens: int
    complete: bool
    """True when every record was read (tokens is then the corpus's exact size)."""


def check_job(
    cfg: Config,
    *,
    nproc_per_node: int | None = None,
    files: bool = True,
    device: bool = True,
    say: Callable[[str], None] | None = None,
) -> None:
    """Check what ``cfg`` points at from this host; raises the job's own error types (see training.errors).

    ``files=False`` where the job's files are not visible (a submit host outside the cluster's storage);
    ``device=False`` where the job will not run (a login or head node without GPUs).
    """
    if device:
        check_device(cfg.parallel, preset=cfg.preset, nproc_per_node=nproc_per_node)
    if files:
        check_inputs(init_from=cfg.model.init_from, initial_load_path=cfg.checkpoint.initial_load_path)
        if cfg.model.init_from:
            check_pretrained_dir(cfg.model.init_from, cfg.model)
        check_locations(
            out_dir=cfg.job.out_dir,
            checkpoint_dir=cfg.checkpoint.dir,
            metrics_path=cfg.metrics.path,
            memory_dir=cfg.checkpoint.memory_dir if cfg.checkpoint.memory_interval else "",
        )
        check_data(cfg.data, min_samples=cfg.train.global_batch, say=say)


def check_inputs(*, init_from: str, initial_load_path: str) -> None:
    """Weights a run starts from are local directories (nothing is downloaded)."""
    if init_from and not os.path.isdir(init_from):
        raise ConfigError(
            f"model.init_from={init_from!r} is not a local directory; pass a directory with "
            "config.json and weights (hub names are not downloaded)"
        )
    if initial_load_path and not os.path.isdir(initial_load_path):
        raise ConfigError(
            f"checkpoint.initial_load_path={initial_load_path!r} is not a directory; pass a "
            "step_NNNNNNNN checkpoint directory or another run's checkpoint.dir"
        )


def already_checked() -> bool:
    return os.environ.get(DONE_ENV) == "1"


def check_data(d: DataConfig, *, min_samples: int, say: Callable[[str], None] | None = None) -> CorpusFacts | None:
    """The corpus exists, every file is a readable regular file of the right format with the text field (a
    prepared directory: its manifest is readable and every shard has the size it lists), and it holds at least
    ``min_samples`` samples (one global batch). None for the built-in corpus."""
    if d.source == "builtin":
        return None
    raw_len, _ = raw_length_for(d.seq_len, d.noise_density, d.mean_span_len)
    if is_prepared(d.source):
        m = read_manifest(d.source)
        _enough(d, min_samples, raw_len, tokens=m.tokens, documents=m.documents)
        return CorpusFacts(
            files=len(m.shards), bytes=m.tokens * TOKEN_BYTES, documents=m.documents, tokens=m.tokens, complete=True
        )
    need = raw_len * min_samples
    files = data_files(d.source)
    size = sum(os.path.getsize(f) for f in files)
    complete = size <= FULL_SCAN_BYTES
    if say and size > PROGRESS_BYTES:
        say(
            f"checking data.source {d.source} ({size / 2**20:,.0f} MiB in {len(files)} file(s)"
            f"{'' if complete else f', the first {HEAD_RECORDS} records of each'})"
        )
    docs = tokens = 0
    for path in files:
        for n, text in enumerate(iter_texts(path, d.text_field), 1):
            docs += 1
            tokens += token_count(text)
            if not complete and n >= HEAD_RECORDS and tokens >= need:
                break
    if docs == 0:
        what = "an empty file" if len(files) == 1 else f"{len(files)} files, all empty"
        raise DataSourceError(f"data.source={d.source!r} holds no documents ({what}); {FIX}")
    _enough(d, min_samples, raw_len, tokens=tokens, documents=docs)
    return CorpusFacts(files=len(files), bytes=size, documents=docs, tokens=tokens, complete=complete)


def _enough(d: DataConfig, min_samples: int, raw_len: int, *, tokens: int, documents: int) -> None:
    need = raw_len * min_samples
    if tokens < need:
        raise DataSourceError(
            f"data.source={d.source!r} holds {tokens:,} tokens (bytes) in {documents:,} document(s): "
            f"{tokens // raw_len} sample(s) of {raw_len} tokens at data.seq_len={d.seq_len}, fewer than one global "
            f"batch (train.global_batch={min_samples} needs {need:,} tokens); add text, or lower "
            "--train.global_batch or --data.seq_len"
        )


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    return p


def _why_not_writable(path: str) -> str | None:
    """None when this user can write a file in directory ``path`` (a real write, so a full or read-only file
    system and missing permissions all show); else the reason, in words."""
    probe = os.path.join(path, f"{PROBE}-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return f"permission denied for this user ({path}, mode {stat.filemode(os.stat(path).st_mode)})"
        return f"{storage_reason(e)} ({path})"
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
        return None
    except OSError as e:
        return f"{storage_reason(e)} ({path})"
    finally:
        os.close(fd)
        os.unlink(probe)


def check_locations(*, out_dir: str, checkpoint_dir: str, metrics_path: str, memory_dir: str = "") -> None:
    """Each location is a directory (or a regular file, for the metrics) or can be created as one, and a file can
    be written there; the checkpoint directory is not inside another run's checkpoints nor holds one.
    ``memory_dir``: checkpoint.memory_dir when set (node-local; its room is checked by the tier itself)."""
    locations = [
        ("job.out_dir", out_dir, True),
        ("checkpoint.dir", checkpoint_dir, True),
        ("metrics.path", metrics_path, False),
    ]
    if memory_dir:
        locations.append(("checkpoint.memory_dir", memory_dir, True))
    for name, path, want_dir in locations:
        flag = f"--{name}"
        if os.path.lexists(path):
            is_dir = os.path.isdir(path)
            if want_dir and not is_dir:
                raise ConfigError(
                    f"{name}={path!r} is a file, not a directory; pass a directory ({flag} DIR; "
                    "it is created if missing)"
                )
            if not want_dir and is_dir:
                raise ConfigError(f"{name}={path!r} is a directory; pass a file path ({flag} DIR/metrics.jsonl)")
            if not want_dir and not stat.S_ISREG(os.stat(path).st_mode):
                raise ConfigError(
                    f"{name}={path!r} is {_kind(path)}, not a regular file; pass a file path ({flag} DIR/metrics.jsonl)"
                )
            where = path if is_dir else os.path.dirname(os.path.abspath(path))
        else:
            where = _nearest_existing(path)
            if not os.path.isdir(where):
                raise ConfigError(
                    f"{name}={path!r} cannot be created: {where} is a file, not a directory; pass another path ({flag})"
                )
        why = _why_not_writable(where)
        if why is not None:
            raise ConfigError(f"{name}={path!r} is not writable: {why}; pass a writable path ({flag})")
    problem = nesting_problem(checkpoint_dir)
    if problem:
        raise ConfigError(problem)


def _kind(path: str) -> str:
    mode = os.stat(path).st_mode
    for test, what in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def check_device(p: ParallelConfig, *, preset: str, nproc_per_node: int | None = None) -> None:
    """``parallel.device=cuda`` needs a GPU here, and one per process on this node."""
    if p.device != "cuda":
        return
    import torch  # deferred: only a GPU job pays for it

    if not torch.cuda.is_available():
        build = torch.__version__ + (", a CPU-only build" if torch.version.cuda is None else "")
        raise ConfigError(
            f"preset {preset!r} trains on CUDA GPUs (parallel.device=cuda), but this machine has none "
            f"visible (torch {build}); here run a CPU preset (--preset debug or t5-60m) or "
            "--parallel.device cpu, or submit it to a GPU cluster (PLATFORM=slurm or PLATFORM=eks)"
        )
    count = torch.cuda.device_count()
    if nproc_per_node and nproc_per_node > count:
        raise ConfigError(
            f"{nproc_per_node} processes per node, but this node has {count} GPU(s) (one per process); "
            f"use --nproc-per-node {count} (NPROC={count})"
        )


__all__ = [
    "CHECK_ERRORS",
    "DONE_ENV",
    "CorpusFacts",
    "DataSourceError",
    "already_checked",
    "check_data",
    "check_device",
    "check_inputs",
    "check_job",
    "check_locations",
]

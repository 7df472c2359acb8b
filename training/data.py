"""Data: an offline text corpus, byte-level tokens, T5 span corruption, and a resumable global order.

Sample ``i`` is a pure function of ``(corpus, seed, i)``. The order of samples is a seeded permutation
per epoch, and the position in that order is one integer, the *global sample offset* (samples consumed
by all ranks together). Rank ``r`` of ``W`` takes slice ``r`` of every global batch, so the offset means
the same thing at any world size: resuming at a different world size neither repeats nor skips a sample.
"""
from __future__ import annotations

import ast
import glob
import hashlib
import os
import random
import sys
import sysconfig
from dataclasses import dataclass

import torch

from training.config import DataConfig
from training.corpus import FIX, DataSourceError, data_files, iter_texts, raw_length_for, span_lengths

PAD, EOS, UNK = 0, 1, 2
BYTE_OFFSET = 3  # ByT5 ids: 0 pad, 1 eos, 2 unk, then 256 bytes, then sentinels from the top down
VOCAB = 384
FIRST_SENTINEL = VOCAB - 1  # <extra_id_0> = 383, <extra_id_1> = 382, ...
MIN_DOC_CHARS = 200


def encode(text: str) -> list[int]:
    """Byte-level token ids, identical to ``ByT5Tokenizer()(text, add_special_tokens=False)``."""
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256).decode("utf-8", "replace")


def builtin_documents() -> list[str]:
    """Real English text available offline wherever Python runs: the standard library's docstrings
    (modules, classes, functions) longer than 200 characters, in a fixed file order."""
    docs = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_DOC_CHARS:
                    docs.append(" ".join(doc.split()))
    if not docs:
        raise RuntimeError("the built-in corpus is empty: this Python has no standard-library sources; "
                           "pass data.source=<path to .jsonl/.parquet text>")
    return docs


def file_documents(source: str, text_field: str) -> list[str]:
    """Texts from a .jsonl / .parquet file, or every such file in a directory (sorted)."""
    docs = [text for path in data_files(source) for text in iter_texts(path, text_field)]
    if not docs:
        raise DataSourceError(f"data.source={source!r} holds no documents (empty files); {FIX}")
    return docs


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """Split `total` into `parts` positive integers, uniformly at random."""
    cuts = sorted(rng.sample(range(1, total), parts - 1)) if parts > 1 else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


class SpanCorruptionDataset(torch.utils.data.Dataset):
    """Fixed-length windows of the token stream, corrupted with T5 span corruption.

    ``input_ids``: kept tokens with each masked span replaced by one sentinel, then EOS, padded.
    ``labels``: each sentinel followed by its span, then EOS, padded with -100 (ignored by the loss).
    """

    def __init__(self, tokens: torch.Tensor, cfg: DataConfig, seed: int):
        self.tokens = tokens
        self.cfg = cfg
        self.seed = seed
        self.raw_len, self.target_len = raw_length_for(cfg.seq_len, cfg.noise_density, cfg.mean_span_len)
        self.n = len(tokens) // self.raw_len
        if self.n < 1:
            raise DataSourceError(f"the corpus has {len(tokens)} tokens, fewer than one sample of {self.raw_len} "
                                  f"(data.seq_len={cfg.seq_len}); add data or lower data.seq_len")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        raw = self.tokens[i * self.raw_len:(i + 1) * self.raw_len].tolist()
        rng = random.Random(self.seed * 1_000_003 + i)
        noise, spans = span_lengths(len(raw), self.cfg.noise_density, self.cfg.mean_span_len)
        noise_lens = _split(noise, spans, rng)
        keep_lens = _split(len(raw) - noise, spans, rng)
        inp, tgt, pos = [], [], 0
        for s, (k, m) in enumerate(zip(keep_lens, noise_lens)):
            inp += raw[pos:pos + k]
            pos += k
            sentinel = FIRST_SENTINEL - s
            inp.append(sentinel)
            tgt.append(sentinel)
            tgt += raw[pos:pos + m]
            pos += m
        inp.append(EOS)
        tgt.append(EOS)
        x = torch.full((self.cfg.seq_len,), PAD, dtype=torch.long)
        x[:len(inp)] = torch.tensor(inp)
        y = torch.full((self.target_len,), -100, dtype=torch.long)
        y[:len(tgt)] = torch.tensor(tgt)
        return {"input_ids": x, "attention_mask": (x != PAD).long(), "labels": y}


CORPUS_VERSION = 1  # bump when builtin_documents() or encode() change, to invalidate caches


def _token_stream(docs: list[str]) -> torch.Tensor:
    stream: list[int] = []
    for d in docs:
        stream += encode(d)
        stream.append(EOS)
    return torch.tensor(stream, dtype=torch.int16)


def builtin_tokens(cache_dir: str | None = None) -> torch.Tensor:
    """The built-in corpus as a token stream, cached on disk: parsing the standard library takes seconds,
    and every restarted worker would pay that on the recovery path."""
    stdlib = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(f"{CORPUS_VERSION}|{sys.version}|{stdlib}".encode()).hexdigest()[:16]
    cache_dir = cache_dir or os.environ.get("T5F_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "t5-failover")
    path = os.path.join(cache_dir, f"corpus-{key}.pt")
    try:
        return torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError):
        pass  # absent or unreadable: rebuild
    tokens = _token_stream(builtin_documents())
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save(tokens, tmp)
        os.replace(tmp, path)  # atomic, so concurrent ranks never read half a file
    except OSError:
        pass  # a read-only home is fine: just no cache
    return tokens


def build_dataset(cfg: DataConfig, seed: int) -> SpanCorruptionDataset:
    tokens = builtin_tokens() if cfg.source == "builtin" else _token_stream(file_documents(cfg.source,
                                                                                           cfg.text_field))
    return SpanCorruptionDataset(tokens, cfg, seed)


@dataclass
class GlobalOrder:
    """Maps a global sample offset to dataset indices: a seeded permutation per epoch."""

    num_samples: int
    seed: int

    def index(self, offset: int) -> int:
        epoch, pos = divmod(offset, self.num_samples)
        return int(self._perm(epoch)[pos])

    def _perm(self, epoch: int) -> torch.Tensor:
        if getattr(self, "_cached", (None,))[0] != epoch:
            g = torch.Generator().manual_seed(self.seed + 7919 * epoch)
            self._cached = (epoch, torch.randperm(self.num_samples, generator=g))
        return self._cached[1]

    def rank_indices(self, offset: int, global_batch: int, rank: int, world: int) -> list[int]:
        """Dataset indices rank `rank` trains on for the global batch starting at `offset`."""
        per = global_batch // world
        start = offset + rank * per
        return [self.index(o) for o in range(start, start + per)]


class ResumableBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's index list for each global batch, from a starting global offset onwards."""

    def __init__(self, order: GlobalOrder, global_batch: int, rank: int, world: int, start_offset: int):
        self.order, self.gb, self.rank, self.world = order, global_batch, rank, world
        self.start_offset = start_offset

    def __iter__(self):
        offset = self.start_offset
        while True:
            yield self.order.rank_indices(offset, self.gb, self.rank, self.world)
            offset += self.gb


def build_dataloader(dataset: SpanCorruptionDataset, cfg: DataConfig, *, seed: int, global_batch: int,
                     rank: int, world: int, start_offset: int) -> torch.utils.data.DataLoader:
    """An endless loader of this rank's micro-batches starting at the global offset `start_offset`."""
    sampler = ResumableBatchSampler(GlobalOrder(len(dataset), seed), global_batch, rank, world, start_offset)
    # The loader gets its own generator so creating it does not consume the global (dropout) RNG.
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.num_workers,
                                       generator=torch.Generator().manual_seed(seed),
                                       persistent_workers=cfg.num_workers > 0)

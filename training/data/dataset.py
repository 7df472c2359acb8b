"""Data: an offline text corpus, byte-level tokens, T5 span corruption, and a resumable global order.

Sample ``i`` of epoch ``e`` is a pure function of ``(corpus, seed, e, i)``: window ``i`` of the token
stream, with noise masks drawn anew each epoch. The order of samples is a seeded permutation per epoch, and
the position in that order is one integer, the *global sample offset* (samples consumed by all ranks
together). Rank ``r`` of ``W`` takes slice ``r`` of every global batch, so the offset means the same thing at
any world size: resuming at a different world size neither repeats nor skips a sample.

The token stream is held in memory (the built-in corpus, a .jsonl/.parquet source) or memory-mapped from a
prepared directory, which a corpus of any size should be turned into once::

    python -m training.data prepare /fsx/corpus /fsx/corpus-prepared [--text-field text]
    python -m training.data verify /fsx/corpus-prepared    # every byte against prepare's hashes
"""

from __future__ import annotations

import argparse
import ast
import bisect
import glob
import hashlib
import logging
import os
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy
import torch

from training.config import ConfigError, DataConfig
from training.data.corpus import FIX, DataSourceError, data_files, iter_texts, raw_length_for, span_lengths
from training.data.prepared import (
    MANIFEST,
    REDO,
    TOKEN_BYTES,
    Manifest,
    ShardWriter,
    is_prepared,
    read_manifest,
    verify_contents,
)

log = logging.getLogger("training.data")

PAD, EOS, UNK = 0, 1, 2
BYTE_OFFSET = 3  # ByT5 ids: 0 pad, 1 eos, 2 unk, then 256 bytes, then sentinels from the top down
VOCAB = 384
FIRST_SENTINEL = VOCAB - 1  # <extra_id_0> = 383, <extra_id_1> = 382, ...
MIN_DOC_CHARS = 200
# The ids a token stream holds (prepare writes nothing else): EOS after each document, and the 256 byte ids.
# Anything else read from a stream (a negative id, one past the vocabulary, a sentinel) is damage.
STREAM_IDS = f"{EOS} and {BYTE_OFFSET}..{BYTE_OFFSET + 255}"
_NOT_A_STREAM_ID = numpy.ones(2**16, dtype=bool)  # indexed by an int16 id's bits read as uint16
_NOT_A_STREAM_ID[[EOS, *range(BYTE_OFFSET, BYTE_OFFSET + 256)]] = False
# Epoch 0 keeps the per-sample noise seeds of before epochs drew new noise (a run's first epoch is what it
# always was); epoch e's seeds lie e * 2**64 further on, beyond every epoch-0 seed of a realistic job.seed.
NOISE_EPOCH_STRIDE = 2**64


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
        raise RuntimeError(
            "the built-in corpus is empty: this Python has no standard-library sources; "
            "pass data.source=<path to .jsonl/.parquet text>"
        )
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


class ShardedTokens:
    """The token stream of a prepared directory, memory-mapped shard by shard: ``len(t)`` tokens, and ``t[a:b]``
    the int16 tensor of tokens ``a`` to ``b - 1`` (across shard boundaries). Pages are read on first use and
    the kernel can drop them again, so a rank's memory does not grow with the corpus."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self._starts = [0]
        for shard in manifest.shards[:-1]:
            self._starts.append(self._starts[-1] + shard.tokens)
        self._maps = self._map()

    def _map(self) -> list[torch.Tensor]:
        # shared=False: the file is opened read-only and mapped copy-on-write, so nothing can reach the file;
        # torch keeps no file descriptor per map (a corpus may have thousands of shards).
        return [
            torch.from_file(self.manifest.path(s), shared=False, size=s.tokens, dtype=torch.int16)
            for s in self.manifest.shards
        ]

    def __getstate__(self) -> dict:
        return {"manifest": self.manifest}  # a DataLoader worker started by spawn maps the files itself

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["manifest"])

    def __len__(self) -> int:
        return self.manifest.tokens

    def where(self, index: int) -> str:
        """Where token ``index`` of the stream lies on disk, for messages."""
        shard = bisect.bisect_right(self._starts, index) - 1
        offset = index - self._starts[shard]
        return (
            f"shard {self.manifest.path(self.manifest.shards[shard])} at token {offset:,} (byte "
            f"{offset * TOKEN_BYTES:,})"
        )

    def damage_fix(self) -> str:
        d = self.manifest.directory
        return (
            f"the shard was damaged after prepare; check the directory with `python -m training.data verify "
            f"{d}`, then {REDO.format(dst=d)}"
        )

    def __getitem__(self, span: slice) -> torch.Tensor:
        start, stop, step = span.indices(len(self))
        if step != 1:
            raise ValueError(f"ShardedTokens takes contiguous slices [a:b], not step {step}")
        pieces = []
        shard = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            base, tokens = self._starts[shard], self._maps[shard]
            end = min(stop, base + len(tokens))
            pieces.append(tokens[start - base : end - base])
            start, shard = end, shard + 1
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int16)


def _check_stream_ids(window: torch.Tensor, start: int, tokens: torch.Tensor | ShardedTokens) -> None:
    """Raise DataSourceError naming where and what, if ``window`` (tokens ``start``... of ``tokens``) holds an id
    no stream holds. Checked as each sample is read (microseconds for a window): a bit flipped on disk would
    otherwise surface as an IndexError deep in the embedding, or train silently on a sentinel."""
    bad = _NOT_A_STREAM_ID[window.numpy().view(numpy.uint16)]  # one lookup per token: ~10 us for 512
    if not bad.any():
        return
    at = int(bad.argmax())
    value = int(window[at])
    if isinstance(tokens, ShardedTokens):
        place, fix = tokens.where(start + at), tokens.damage_fix()
    else:  # an in-memory stream is encoded from text by this code: never any other id
        place, fix = f"token {start + at:,} of the in-memory token stream", "please report this as a bug"
    raise DataSourceError(
        f"{place} holds token id {value}, which no token stream holds (only {STREAM_IDS}; the "
        f"vocabulary has {VOCAB}): {fix}"
    )


class SpanCorruptionDataset(torch.utils.data.Dataset):
    """Fixed-length windows of the token stream, corrupted with T5 span corruption.

    ``tokens``: an int16 tensor, or the :class:`ShardedTokens` of a prepared directory (anything with ``len``
    and ``[a:b]`` slices). ``ds[i]`` is sample ``i`` with its first epoch's noise, ``ds[e, i]`` with epoch
    ``e``'s (what the training loader asks for; see :class:`GlobalOrder`).
    ``input_ids``: kept tokens with each masked span replaced by one sentinel, then EOS, padded.
    ``labels``: each sentinel followed by its span, then EOS, padded with -100 (ignored by the loss).
    A window holding an id that no stream holds (a damaged shard) raises DataSourceError naming where.
    """

    def __init__(self, tokens: torch.Tensor | ShardedTokens, cfg: DataConfig, seed: int):
        self.tokens = tokens
        self.cfg = cfg
        self.seed = seed
        self.raw_len, self.target_len = raw_length_for(cfg.seq_len, cfg.noise_density, cfg.mean_span_len)
        self.n = len(tokens) // self.raw_len
        if self.n < 1:
            raise DataSourceError(
                f"the corpus has {len(tokens)} tokens, fewer than one sample of {self.raw_len} "
                f"(data.seq_len={cfg.seq_len}); add data or lower data.seq_len"
            )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, i = key if isinstance(key, tuple) else (0, key)
        window = self.tokens[i * self.raw_len : (i + 1) * self.raw_len]
        _check_stream_ids(window, i * self.raw_len, self.tokens)
        raw = window.tolist()
        rng = random.Random(self.seed * 1_000_003 + i + epoch * NOISE_EPOCH_STRIDE)
        noise, spans = span_lengths(len(raw), self.cfg.noise_density, self.cfg.mean_span_len)
        noise_lens = _split(noise, spans, rng)
        keep_lens = _split(len(raw) - noise, spans, rng)
        inp, tgt, pos = [], [], 0
        for s, (k, m) in enumerate(zip(keep_lens, noise_lens)):
            inp += raw[pos : pos + k]
            pos += k
            sentinel = FIRST_SENTINEL - s
            inp.append(sentinel)
            tgt.append(sentinel)
            tgt += raw[pos : pos + m]
            pos += m
        inp.append(EOS)
        tgt.append(EOS)
        x = torch.full((self.cfg.seq_len,), PAD, dtype=torch.long)
        x[: len(inp)] = torch.tensor(inp)
        y = torch.full((self.target_len,), -100, dtype=torch.long)
        y[: len(tgt)] = torch.tensor(tgt)
        return {"input_ids": x, "attention_mask": (x != PAD).long(), "labels": y}


CORPUS_VERSION = 2  # bump when builtin_documents(), the stream's encoding or the cache's format change


# No UTF-8 text holds this byte, so it marks the document ends in the joined bytes of many documents.
_DOCUMENT_END = 0xFF


def _token_stream(docs: Iterable[str]) -> torch.Tensor:
    """The int16 token stream of (at least one of) ``docs``: each document's ``encode`` ids, then EOS."""
    joined = bytearray()
    for d in docs:
        joined += d.encode("utf-8")
        joined.append(_DOCUMENT_END)
    ids = torch.frombuffer(joined, dtype=torch.uint8).to(torch.int16) + BYTE_OFFSET
    return ids.masked_fill_(ids == _DOCUMENT_END + BYTE_OFFSET, EOS)


def _stream_sha256(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.numpy().tobytes()).hexdigest()


def _load_cached_tokens(path: str) -> torch.Tensor:
    """The token stream cached in ``path``; ValueError saying what is wrong with a damaged file (torch.load checks
    no checksum: a flipped bit would load, and change the run's data and its fingerprint)."""
    try:
        cached = torch.load(path, weights_only=True)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - garbage makes torch.load raise IndexError, UnpicklingError, ...
        raise ValueError(f"torch.load raised {type(e).__name__}") from None
    tokens = cached.get("tokens") if isinstance(cached, dict) else None
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int16 or tokens.dim() != 1:
        raise ValueError("it holds no token stream")
    if _stream_sha256(tokens) != cached.get("sha256"):
        raise ValueError("its tokens differ from the sha256 recorded with them")
    return tokens


def cached_tokens(path: str, build: Callable[[], torch.Tensor], what: str) -> torch.Tensor:
    """The token stream cached in file ``path``, or ``build()``'s, then cached there. A damaged cache is derived
    data: it is rebuilt, with one warning naming ``what`` and ``path``."""
    try:
        return _load_cached_tokens(path)
    except OSError:
        pass  # absent (the first run here) or unreadable: rebuild
    except ValueError as e:
        log.warning("WARNING: the cache of %s, %s, is damaged (%s); rebuilding it", what, path, e)
    tokens = build()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save({"tokens": tokens, "sha256": _stream_sha256(tokens)}, tmp)
        os.replace(tmp, path)  # atomic, so concurrent ranks never read half a file
    except OSError:
        pass  # a read-only home is fine: just no cache
    return tokens


def builtin_cache_path(cache_dir: str | None = None) -> str:
    """Where the built-in corpus's token stream is cached: one file per corpus version and Python."""
    stdlib = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(f"{CORPUS_VERSION}|{sys.version}|{stdlib}".encode()).hexdigest()[:16]
    cache_dir = (
        cache_dir
        or os.environ.get("T5F_CACHE_DIR")
        or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "t5-failover")
    )
    return os.path.join(cache_dir, f"corpus-{key}.pt")


def builtin_tokens(cache_dir: str | None = None) -> torch.Tensor:
    """The built-in corpus as a token stream, cached on disk: parsing the standard library takes seconds,
    and every restarted worker would pay that on the recovery path."""
    return cached_tokens(
        builtin_cache_path(cache_dir), lambda: _token_stream(builtin_documents()), "the built-in corpus"
    )


def build_dataset(cfg: DataConfig, seed: int) -> SpanCorruptionDataset:
    if cfg.source == "builtin":
        tokens = builtin_tokens()
    elif is_prepared(cfg.source):
        tokens = ShardedTokens(read_manifest(cfg.source))
    else:
        tokens = _token_stream(file_documents(cfg.source, cfg.text_field))
    return SpanCorruptionDataset(tokens, cfg, seed)


@dataclass
class GlobalOrder:
    """Maps a global sample offset to (epoch, dataset index): a seeded permutation per epoch."""

    num_samples: int
    seed: int

    def sample(self, offset: int) -> tuple[int, int]:
        epoch, pos = divmod(offset, self.num_samples)
        return epoch, int(self._perm(epoch)[pos])

    def _perm(self, epoch: int) -> torch.Tensor:
        if getattr(self, "_cached", (None,))[0] != epoch:
            g = torch.Generator().manual_seed(self.seed + 7919 * epoch)
            self._cached = (epoch, torch.randperm(self.num_samples, generator=g))
        return self._cached[1]

    def rank_samples(self, offset: int, global_batch: int, rank: int, world: int) -> list[tuple[int, int]]:
        """The (epoch, dataset index) pairs rank `rank` trains on for the global batch starting at `offset`."""
        per = global_batch // world
        start = offset + rank * per
        return [self.sample(o) for o in range(start, start + per)]


class ResumableBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's (epoch, index) list for each global batch, from a starting global offset onwards."""

    def __init__(self, order: GlobalOrder, global_batch: int, rank: int, world: int, start_offset: int):
        self.order, self.gb, self.rank, self.world = order, global_batch, rank, world
        self.start_offset = start_offset

    def __iter__(self):
        offset = self.start_offset
        while True:
            yield self.order.rank_samples(offset, self.gb, self.rank, self.world)
            offset += self.gb


class _Loader(torch.utils.data.DataLoader):
    """A DataLoader whose workers' DataSourceError reaches the trainer as the one line it was: torch re-raises
    an error of a worker process with the worker's whole traceback as its message."""

    def __iter__(self):
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except DataSourceError as e:
                raise DataSourceError(_worker_message(str(e))) from None
            yield batch


def _worker_message(text: str) -> str:
    """The message of the error that ``text`` (a re-raised worker error's: "Caught ... Original Traceback ...",
    ending in the line ``module.Class: message``) reports; ``text`` itself for an error of this process."""
    if not text.startswith("Caught "):
        return text
    last = text.rstrip().splitlines()[-1]
    return last.split(": ", 1)[1] if ": " in last else last


def build_dataloader(
    dataset: SpanCorruptionDataset,
    cfg: DataConfig,
    *,
    seed: int,
    global_batch: int,
    rank: int,
    world: int,
    start_offset: int,
    pin_memory: bool = False,
) -> torch.utils.data.DataLoader:
    """An endless loader of this rank's micro-batches starting at the global offset `start_offset`. With
    ``data.num_workers`` > 0 the workers prepare the next batches while the current step runs; `pin_memory`
    (for a GPU) puts them in page-locked memory so the copy to the device runs without blocking the host."""
    sampler = ResumableBatchSampler(GlobalOrder(len(dataset), seed), global_batch, rank, world, start_offset)
    # The loader gets its own generator so creating it does not consume the global (dropout) RNG.
    return _Loader(
        dataset,
        batch_sampler=sampler,
        num_workers=cfg.num_workers,
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=cfg.num_workers > 0,
        pin_memory=pin_memory,
    )


DEFAULT_SHARD_TOKENS = 2**26  # 128 MiB shard files
BATCH_CHARS = 2**24  # documents encoded together: one tensor conversion per ~16 MB of text
PROGRESS_S = 10.0


def _batches(texts: Iterable[str], chars: int) -> Iterator[list[str]]:
    """``texts`` in lists of about ``chars`` characters (the last one shorter)."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def prepare(
    source: str,
    destination: str,
    *,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> Manifest:
    """Write the token stream that ``data.source=source`` trains on into prepared directory ``destination``
    (see training.data.prepared), streaming: memory holds one batch of documents, never the corpus. ``say`` gets
    progress lines. A bad SRC or DST raises ConfigError (DataSourceError for SRC) before anything is written; a
    bad record found on the way raises DataSourceError and leaves DST half-written (refused until a rerun)."""
    if source != "builtin" and is_prepared(source):
        raise ConfigError(f"SRC {source!r} is already a prepared directory; train from it: --data.source {source}")
    files = [] if source == "builtin" else data_files(source, name="SRC")
    writer = ShardWriter(destination, shard_tokens, overwrite=overwrite)
    if source == "builtin":
        tokens = builtin_tokens()
        writer.write(tokens.numpy())
        label = f"builtin (the standard library of Python {sys.version.split()[0]})"
        return writer.finish(source=label, text_field=None, documents=int((tokens == EOS).sum()))
    say(
        f"prepare: reading {len(files)} file(s), {sum(map(os.path.getsize, files)) / 2**20:,.0f} MiB, into "
        f"{destination}"
    )
    documents, said = 0, time.monotonic()
    for n, path in enumerate(files, 1):
        for batch in _batches(iter_texts(path, text_field, field_flag="--text-field"), BATCH_CHARS):
            writer.write(_token_stream(batch).numpy())
            documents += len(batch)
            if time.monotonic() - said >= PROGRESS_S:
                say(
                    f"prepare: {writer.tokens:,} tokens of {documents:,} documents so far ({len(writer.shards)} "
                    f"shard(s) complete); reading {path} (file {n} of {len(files)})"
                )
                said = time.monotonic()
    if not documents:
        raise DataSourceError(f"SRC {source!r} holds no documents (empty files); {FIX}")
    return writer.finish(source=os.path.abspath(source), text_field=text_field, documents=documents)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of tokens; e.g. {DEFAULT_SHARD_TOKENS}")
    return value


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_prepare(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        manifest = prepare(
            args.source,
            args.destination,
            text_field=args.text_field,
            shard_tokens=args.shard_tokens,
            overwrite=args.overwrite,
            say=_say,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"error: prepare failed: {e}; fix the cause (space, permissions) and run it again (a partly written "
            "DST is replaced)",
            file=sys.stderr,
        )
        return 1
    print(
        f"prepared {args.destination}: {manifest.tokens:,} tokens of {manifest.documents:,} documents in "
        f"{len(manifest.shards)} shard(s) in {time.monotonic() - started:.1f} s; train with --data.source "
        f"{args.destination}"
    )
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        if not is_prepared(args.directory):
            raise DataSourceError(
                f"{args.directory!r} is not a prepared directory (no {MANIFEST}, no shard files); "
                "pass the DST of `python -m training.data prepare SRC DST`"
            )
        manifest = read_manifest(args.directory)
        verify_contents(manifest, say=_say)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    hashed = "each shard's sha256 and " if all(s.sha256 for s in manifest.shards) else ""
    print(
        f"verified {args.directory}: {manifest.tokens:,} tokens in {len(manifest.shards)} shard(s) match "
        f"{hashed}the sha256 {manifest.sha256[:16]}... that prepare recorded ({time.monotonic() - started:.1f} s)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m training.data prepare SRC DST [--text-field F] [--shard-tokens N] [--overwrite]`` or
    ``python -m training.data verify DST``; exit 0, 2 for bad input or a damaged DST (the message names it and the
    fix), 1 when writing fails (DST is then half-written)."""
    parser = argparse.ArgumentParser(prog="python -m training.data", description="Data tools of the training job.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd = commands.add_parser(
        "prepare",
        help="turn a corpus into a prepared directory, once, for training from memory maps",
        description="Encode SRC's documents (byte-level tokens, EOS after each document: exactly the stream "
        "--data.source SRC trains on) into DST as raw little-endian int16 shard files plus "
        "manifest.json, written last. Train with --data.source DST: every rank memory-maps the shards "
        "instead of holding the corpus, and the samples are those of --data.source SRC. Progress goes "
        "to stderr.",
    )
    cmd.add_argument(
        "source",
        metavar="SRC",
        help="what data.source takes: 'builtin', a .jsonl/.parquet file, or a directory of them",
    )
    cmd.add_argument(
        "destination",
        metavar="DST",
        help="directory to write: new, empty, half-written by an interrupted prepare, or prepared "
        "before (with --overwrite)",
    )
    cmd.add_argument(
        "--text-field", default="text", metavar="FIELD", help="field or column holding the text (default: text)"
    )
    cmd.add_argument(
        "--shard-tokens",
        type=_positive_int,
        default=DEFAULT_SHARD_TOKENS,
        metavar="N",
        help=f"tokens per shard file, 2 bytes each (default: {DEFAULT_SHARD_TOKENS}, 128 MiB files)",
    )
    cmd.add_argument(
        "--overwrite", action="store_true", help="replace a prepared DST (never while a job trains from it)"
    )
    cmd.set_defaults(run=_run_prepare)
    cmd = commands.add_parser(
        "verify",
        help="read a prepared directory's every byte and check it against the hashes prepare recorded",
        description="Check that DST holds exactly what prepare wrote: every shard's bytes against its sha256 in "
        "manifest.json, and the whole stream against the run fingerprint. A job's start checks only "
        "the shards' names and sizes (reading a large corpus on every rank would cost minutes), so run "
        "this after copying a prepared directory (to FSx, through S3) and before a long run. Exit 0: "
        "intact; 2: damaged or not a prepared directory (the message names the shard and the fix). "
        "Progress goes to stderr.",
    )
    cmd.add_argument("directory", metavar="DST", help="a prepared directory (the DST of prepare)")
    cmd.set_defaults(run=_run_verify)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

"""A prepared corpus on disk: a ``data.source``'s token stream in fixed-size shard files, and its manifest.

``python -m training.data prepare SRC DST`` writes one (:class:`ShardWriter`); training memory-maps it
(``training.data.dataset.ShardedTokens``) and :mod:`training.job.check` checks it, both through :func:`read_manifest`
(torch-free, so the checks before a job starts stay cheap)::

    DST/tokens-00000.bin ...  raw little-endian int16 token ids, shard_tokens in each (fewer in the last)
    DST/manifest.json         written last and atomically: a directory without it is half-written

    writer = ShardWriter("/fsx/prepared", shard_tokens=2**26, overwrite=False)
    writer.write(int16_buffer); ...
    manifest = writer.finish(source="/fsx/corpus", text_field="text", documents=n)
    manifest = read_manifest("/fsx/prepared")   # DataSourceError names the problem and the fix
    verify_contents(manifest)                     # reads every byte: after a copy, before a long run

``read_manifest`` checks names and sizes only (every rank runs it at start; reading a large corpus there would
cost minutes); ``python -m training.data verify DST`` runs :func:`verify_contents`, which checks the bytes.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from training.config import ConfigError
from training.data.corpus import DataSourceError

MANIFEST = "manifest.json"
FORMAT = "t5-failover prepared tokens"
VERSION = 1
TOKEN_BYTES = 2  # int16, little-endian
SHARD_PATTERN = "tokens-*.bin"
REDO = "re-run `python -m training.data prepare SRC {dst}` (or copy the prepared directory again, completely)"


def shard_name(number: int) -> str:
    return f"tokens-{number:05d}.bin"


@dataclass(frozen=True)
class Shard:
    name: str
    tokens: int
    sha256: str | None = None
    """sha256 of this shard's bytes (``sha256sum tokens-00000.bin``); None in manifests written before it was
    recorded, whose damage :func:`verify_contents` can detect but not place in a shard."""


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` records. ``digest`` is what :func:`training.checkpoint.run_identity.digest_tokens` gives
    for the same token stream held in memory, so a run's fingerprint does not change when its data is prepared."""

    directory: str
    source: str
    text_field: str | None
    documents: int
    tokens: int
    shard_tokens: int
    shards: tuple[Shard, ...]
    sha256: str
    """sha256 of all shards' bytes in order: ``cat tokens-*.bin | sha256sum`` shows the same."""
    digest: str

    def path(self, shard: Shard) -> str:
        return os.path.join(self.directory, shard.name)


def is_prepared(path: str) -> bool:
    """``path`` is a directory that ``prepare`` wrote into (completely or not): it has a manifest or shard files."""
    return os.path.isdir(path) and (
        os.path.exists(os.path.join(path, MANIFEST)) or bool(glob.glob(os.path.join(path, SHARD_PATTERN)))
    )


def read_manifest(directory: str) -> Manifest:
    """The manifest of prepared directory ``directory``, checked against the shard files on disk (their names and
    sizes; their contents are not read). Raises :class:`DataSourceError` naming the problem and the fix."""
    redo = REDO.format(dst=directory)
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        shards = len(glob.glob(os.path.join(directory, SHARD_PATTERN)))
        raise DataSourceError(
            f"data.source={directory!r} is a half-written prepared directory ({shards} shard "
            f"file(s) but no {MANIFEST}: its prepare did not finish); {redo}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        raise DataSourceError(f"{path} cannot be read: {e.strerror}; make it readable by this user") from None
    except ValueError as e:  # not JSON: cut short by a copy, or edited
        raise DataSourceError(f"{path} is not JSON ({e}); {redo}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataSourceError(
            f'{path} is not a prepared-corpus manifest (no "format": {FORMAT!r}); if '
            f"{directory} is a directory of .jsonl/.parquet files, move {MANIFEST} out of it"
        )
    if raw.get("version") != VERSION:
        raise DataSourceError(
            f"{path} is format version {raw.get('version')!r}, this code reads version {VERSION}; {redo} with this code"
        )
    try:
        shards = tuple(Shard(s["name"], s["tokens"], s.get("sha256")) for s in raw["shards"])
        manifest = Manifest(
            directory=directory,
            source=raw["source"],
            text_field=raw["text_field"],
            documents=raw["documents"],
            tokens=raw["tokens"],
            shard_tokens=raw["shard_tokens"],
            shards=shards,
            sha256=raw["sha256"],
            digest=raw["digest"],
        )
        listed = sum(s.tokens for s in shards)
    except (KeyError, TypeError, AttributeError) as e:  # not the fields prepare writes
        raise DataSourceError(f"{path} lacks what prepare writes ({type(e).__name__}: {e}); {redo}") from None
    if listed != manifest.tokens:
        raise DataSourceError(
            f"{path} lists {len(shards)} shard(s) of {listed:,} tokens but a total of {manifest.tokens:,}; {redo}"
        )
    for s in shards:
        try:
            size = os.path.getsize(manifest.path(s))
        except OSError as e:
            raise DataSourceError(
                f"shard {manifest.path(s)} (listed in {MANIFEST}) cannot be read: {e.strerror}; {redo}"
            ) from None
        if not os.access(manifest.path(s), os.R_OK):
            raise DataSourceError(
                f"shard {manifest.path(s)} is not readable by this user; make the prepared directory's files readable"
            )
        if size != s.tokens * TOKEN_BYTES:
            raise DataSourceError(
                f"shard {manifest.path(s)} has {size:,} bytes, {MANIFEST} says "
                f"{s.tokens * TOKEN_BYTES:,} ({s.tokens:,} tokens): it was truncated or changed "
                f"after prepare; {redo}"
            )
    return manifest


def _files_prepare_writes(directory: str) -> set[str]:
    return {MANIFEST, f"{MANIFEST}.tmp"} | {
        os.path.basename(p) for p in glob.glob(os.path.join(directory, SHARD_PATTERN))
    }


class ShardWriter:
    """Writes a token stream into ``directory`` as shards of ``shard_tokens`` tokens, then its manifest.

    ``directory`` is created, or must be empty, half-written (replaced), or prepared (replaced with
    ``overwrite``); anything else raises :class:`ConfigError` before a byte is written. Nothing is readable
    before :meth:`finish` writes the manifest.
    """

    def __init__(self, directory: str, shard_tokens: int, *, overwrite: bool = False):
        self.directory, self.shard_tokens = directory, shard_tokens
        self._claim(overwrite)
        self.tokens = 0
        self.shards: list[Shard] = []
        self._file = None
        self._in_shard = 0
        self._sha256 = hashlib.sha256()
        self._shard_sha256 = hashlib.sha256()
        self._digest = hashlib.blake2b(digest_size=8)  # training.checkpoint.run_identity.digest_tokens's hash

    def _claim(self, overwrite: bool) -> None:
        d = self.directory
        if os.path.lexists(d) and not os.path.isdir(d):
            raise ConfigError(f"DST {d!r} is a file; pass a directory path for the prepared corpus (it is created)")
        if not os.path.isdir(d):
            os.makedirs(d)
            return
        entries = set(os.listdir(d))
        others = sorted(entries - _files_prepare_writes(d))
        if others:
            raise ConfigError(
                f"DST {d!r} exists and is not a prepared directory (it holds {', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}); pass a new or empty directory"
            )
        if MANIFEST in entries and not overwrite:
            raise ConfigError(
                f"DST {d!r} already holds a prepared corpus; pass --overwrite to replace it (not "
                "while a job trains from it) or choose another DST"
            )
        for name in sorted(entries, key=lambda n: n != MANIFEST):  # the manifest first: never valid but partial
            os.remove(os.path.join(d, name))

    def write(self, tokens) -> None:
        """Append ``tokens``, a C-contiguous buffer of int16 token ids (e.g. ``tensor.numpy()``)."""
        data = memoryview(tokens).cast("B")
        while data:
            if self._file is None:
                self._file = open(os.path.join(self.directory, shard_name(len(self.shards))), "wb")
            take = min(len(data), (self.shard_tokens - self._in_shard) * TOKEN_BYTES)
            piece, data = data[:take], data[take:]
            self._file.write(piece)
            self._sha256.update(piece)
            self._shard_sha256.update(piece)
            self._digest.update(piece)
            self._in_shard += take // TOKEN_BYTES
            self.tokens += take // TOKEN_BYTES
            if self._in_shard == self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk before the manifest that vouches for it
        self._file.close()
        self.shards.append(Shard(shard_name(len(self.shards)), self._in_shard, self._shard_sha256.hexdigest()))
        self._file, self._in_shard, self._shard_sha256 = None, 0, hashlib.sha256()

    def finish(self, *, source: str, text_field: str | None, documents: int) -> Manifest:
        """Close the last shard and write the manifest (atomically: a reader sees all of it or none)."""
        if self._file is not None:
            self._close_shard()
        manifest = Manifest(
            directory=self.directory,
            source=source,
            text_field=text_field,
            documents=documents,
            tokens=self.tokens,
            shard_tokens=self.shard_tokens,
            shards=tuple(self.shards),
            sha256=self._sha256.hexdigest(),
            digest=self._digest.hexdigest(),
        )
        record = {"format": FORMAT, "version": VERSION, **asdict(manifest)}
        del record["directory"]  # a prepared directory may be moved or copied
        path = os.path.join(self.directory, MANIFEST)
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)
        return manifest


READ_BYTES = 2**23  # 8 MiB reads: large enough for Lustre's stripes, small enough to stay out of memory
PROGRESS_S = 10.0


def verify_contents(manifest: Manifest, *, say: Callable[[str], None] = lambda line: None) -> None:
    """Read every shard of ``manifest`` (from :func:`read_manifest`, which has checked the sizes) and check its
    bytes against the hashes ``prepare`` recorded: each shard's sha256 where the manifest has it, then the whole
    stream's sha256 and the run fingerprint's digest. Raises :class:`DataSourceError` naming the first shard that
    differs (or the directory, for a manifest without per-shard hashes) and the fix. ``say`` gets progress lines
    about every 10 s."""
    redo = REDO.format(dst=manifest.directory)
    # digest: training.checkpoint.run_identity.digest_tokens's hash
    whole, digest = hashlib.sha256(), hashlib.blake2b(digest_size=8)
    done, said = 0, time.monotonic()
    for n, shard in enumerate(manifest.shards, 1):
        mine = hashlib.sha256()
        try:
            with open(manifest.path(shard), "rb") as f:
                while block := f.read(READ_BYTES):
                    for h in (whole, digest, mine):
                        h.update(block)
                    done += len(block)
                    if time.monotonic() - said >= PROGRESS_S:
                        say(
                            f"verify: {done / 2**20:,.0f} of {manifest.tokens * TOKEN_BYTES / 2**20:,.0f} MiB read "
                            f"(shard {n} of {len(manifest.shards)})"
                        )
                        said = time.monotonic()
        except OSError as e:
            raise DataSourceError(f"shard {manifest.path(shard)} cannot be read: {e.strerror}; {redo}") from None
        if shard.sha256 is not None and mine.hexdigest() != shard.sha256:
            raise DataSourceError(
                f"shard {manifest.path(shard)} differs from what prepare wrote (sha256 "
                f"{mine.hexdigest()[:16]}..., {MANIFEST} says {shard.sha256[:16]}...): it was "
                f"damaged or changed after prepare; {redo}"
            )
    if done != manifest.tokens * TOKEN_BYTES:  # a shard changed size since read_manifest looked
        raise DataSourceError(
            f"{manifest.directory} holds {done:,} bytes of shards, {MANIFEST} says "
            f"{manifest.tokens * TOKEN_BYTES:,}; {redo}"
        )
    if whole.hexdigest() != manifest.sha256 or digest.hexdigest() != manifest.digest:
        raise DataSourceError(
            f"the shards of {manifest.directory} differ from what prepare wrote (sha256 "
            f"{whole.hexdigest()[:16]}..., {MANIFEST} says {manifest.sha256[:16]}...): a shard "
            f"was damaged or changed after prepare, or {MANIFEST} was edited; {redo}"
        )

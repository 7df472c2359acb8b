"""Prepared directories (``python -m training.data prepare``): the same samples as their source, memory-mapped
shards, exact resume across shard and epoch boundaries, and clear errors for a half-written or damaged one."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from training.config import DataConfig
from training.data.corpus import DataSourceError
from training.data.dataset import (
    GlobalOrder,
    ResumableBatchSampler,
    ShardedTokens,
    build_dataloader,
    build_dataset,
    main,
    prepare,
)
from training.job.check import check_data
from training.data.prepared import MANIFEST, ShardWriter, read_manifest, verify_contents
from training.checkpoint.run_identity import digest_tokens

SHARD = 997  # a prime: sample windows (70 tokens at seq_len 64) straddle most shard boundaries


def corpus(path: Path, n: int = 60) -> Path:
    """A jsonl corpus of varied documents: non-ASCII text, different lengths, an empty one."""
    docs = [f"Document {i}: " + "naïve façade — " * (i % 7) + "the quick brown fox. " * (3 + i % 11) for i in range(n)]
    docs[5] = ""
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def samples(ds, keys) -> list[dict[str, torch.Tensor]]:
    return [ds[k] for k in keys]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x) for x, y in zip(a, b))


def touches_a_boundary(i: int, raw_len: int, shard_tokens: int) -> bool:
    """Window ``i`` starts a shard (other than the first) or spans two."""
    return i > 0 and ((i + 1) * raw_len - 1) // shard_tokens != (i * raw_len - 1) // shard_tokens


@pytest.fixture
def prepared(tmp_path) -> tuple[Path, Path]:
    src = corpus(tmp_path / "c.jsonl")
    prepare(str(src), str(tmp_path / "prepared"), shard_tokens=SHARD)
    return src, tmp_path / "prepared"


def test_a_prepared_jsonl_gives_the_samples_of_its_source_across_shard_boundaries(prepared):
    src, dst = prepared
    direct = build_dataset(DataConfig(source=str(src), seq_len=64), seed=3)
    mapped = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=3)
    manifest = read_manifest(str(dst))
    assert len(manifest.shards) > 10 and {s.tokens for s in manifest.shards[:-1]} == {SHARD}
    assert manifest.tokens == len(direct.tokens) == len(mapped.tokens) and manifest.documents == 60
    assert mapped.tokens[0 : len(mapped.tokens)].equal(direct.tokens)
    assert len(mapped) == len(direct)
    assert sum(touches_a_boundary(i, mapped.raw_len, SHARD) for i in range(len(mapped))) > 10
    keys = [(epoch, i) for epoch in (0, 1, 4) for i in range(len(direct))]
    assert same(samples(mapped, keys), samples(direct, keys))
    # the bytes on disk are the stream, hashed as the manifest says
    assert manifest.sha256 == hashlib.sha256(direct.tokens.numpy().tobytes()).hexdigest()


def test_a_prepared_builtin_corpus_gives_the_builtin_samples(tmp_path):
    manifest = prepare("builtin", str(tmp_path / "b"), shard_tokens=50_000)
    direct = build_dataset(DataConfig(), seed=1)
    mapped = build_dataset(DataConfig(source=str(tmp_path / "b")), seed=1)
    assert len(manifest.shards) > 10 and manifest.tokens == len(direct.tokens)
    assert manifest.documents == int((direct.tokens == 1).sum())
    assert mapped.tokens[0 : len(mapped.tokens)].equal(direct.tokens)
    # every sample whose window touches a shard boundary, and a spread of the others
    near = {b * 50_000 // mapped.raw_len for b in range(1, len(manifest.shards))}
    keys = [(e, i) for e in (0, 1) for i in sorted(near | set(range(0, len(direct), 97)))]
    assert same(samples(mapped, keys), samples(direct, keys))


def test_the_run_fingerprint_of_prepared_data_is_its_sources_and_read_from_the_manifest(prepared):
    src, dst = prepared
    direct = build_dataset(DataConfig(source=str(src), seq_len=64), seed=0)
    mapped = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=0)
    assert digest_tokens(mapped.tokens) == digest_tokens(direct.tokens)  # preparing does not change the run
    shard = dst / "tokens-00003.bin"
    shard.write_bytes(bytes(len(shard.read_bytes())))  # same size, other content: only `verify` (a full read) sees it
    assert digest_tokens(build_dataset(DataConfig(source=str(dst), seq_len=64), seed=0).tokens) == digest_tokens(
        direct.tokens
    )


def test_the_shards_are_memory_mapped_not_loaded(prepared):
    _, dst = prepared
    ds = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=0)
    assert isinstance(ds.tokens, ShardedTokens) and not isinstance(ds.tokens, torch.Tensor)
    maps = Path("/proc/self/maps").read_text()
    assert all(str(dst / s.name) in maps for s in ds.tokens.manifest.shards)
    # what a DataLoader worker started by spawn receives: the manifest, not the corpus
    copy = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds.tokens)) < 4096 < len(ds.tokens) * 2
    assert same(samples(copy, [(1, 7), (0, 30)]), samples(ds, [(1, 7), (0, 30)]))


def batches(loader, n: int) -> list[dict]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("shard_tokens", [70 * 4, SHARD])  # windows start shards / straddle them
def test_resume_at_a_shard_boundary_and_in_a_later_epoch_continues_the_straight_run(tmp_path, shard_tokens):
    src = corpus(tmp_path / "c.jsonl")
    prepare(str(src), str(tmp_path / "p"), shard_tokens=shard_tokens)
    cfg = DataConfig(source=str(tmp_path / "p"), seq_len=64)
    ds = build_dataset(cfg, seed=2)
    gb, order = 4, GlobalOrder(len(ds), 2)
    assert ds.raw_len == 70 and len(ds) > 3 * gb
    steps = 2 * len(ds) // gb + 3  # into the third epoch
    straight = batches(build_dataloader(ds, cfg, seed=2, global_batch=gb, rank=0, world=1, start_offset=0), steps)
    # resume with a first batch that reads across a shard boundary, and at a step in epoch 2
    at_boundary = next(
        step
        for step in range(1, steps)
        if any(touches_a_boundary(i, 70, shard_tokens) for _, i in order.rank_samples(step * gb, gb, 0, 1))
    )
    for step in (at_boundary, 2 * len(ds) // gb + 1):
        resumed = build_dataloader(ds, cfg, seed=2, global_batch=gb, rank=0, world=1, start_offset=step * gb)
        assert same(batches(resumed, steps - step), straight[step:])
    direct = build_dataset(DataConfig(source=str(src), seq_len=64), seed=2)
    assert same(
        batches(build_dataloader(direct, cfg, seed=2, global_batch=gb, rank=0, world=1, start_offset=0), steps),
        straight,
    )
    sampler = ResumableBatchSampler(order, gb, 0, 1, start_offset=(steps - 1) * gb)
    assert {epoch for epoch, _ in next(iter(sampler))} == {2}


def test_a_half_written_directory_is_refused_with_the_fix(tmp_path):
    writer = ShardWriter(str(tmp_path / "half"), shard_tokens=100)
    writer.write(torch.arange(3, 253, dtype=torch.int16).numpy())  # prepare stopped before its manifest
    assert len(os.listdir(tmp_path / "half")) == 3
    for check in (
        lambda d: build_dataset(DataConfig(source=d), seed=0),
        lambda d: check_data(DataConfig(source=d), min_samples=1),
    ):
        with pytest.raises(
            DataSourceError,
            match=r"is a half-written prepared directory \(3 shard file\(s\) but no "
            r"manifest.json.*re-run `python -m training.data prepare SRC",
        ):
            check(str(tmp_path / "half"))


def test_a_damaged_prepared_directory_is_refused_with_the_fix(prepared):
    _, dst = prepared
    cfg = DataConfig(source=str(dst), seq_len=64)
    shard = dst / "tokens-00002.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-2])
    for check in (lambda: build_dataset(cfg, seed=0), lambda: check_data(cfg, min_samples=1)):
        with pytest.raises(
            DataSourceError,
            match=r"tokens-00002.bin has 1,992 bytes, manifest.json says 1,994 "
            r"\(997 tokens\): it was truncated or changed after prepare",
        ):
            check()
    shard.unlink()
    with pytest.raises(DataSourceError, match="tokens-00002.bin .listed in manifest.json. cannot be read"):
        check_data(cfg, min_samples=1)
    shard.write_bytes(data)
    (dst / MANIFEST).write_text('{"format": "t5-failover prepared tok')  # cut short by a copy
    with pytest.raises(DataSourceError, match="manifest.json is not JSON .*re-run `python -m training.data prepare"):
        check_data(cfg, min_samples=1)


def flip_a_bit(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_verify_reads_every_byte_and_names_the_shard_that_changed(prepared):
    _, dst = prepared
    manifest = read_manifest(str(dst))
    assert [s.sha256 for s in manifest.shards] == [
        hashlib.sha256((dst / s.name).read_bytes()).hexdigest() for s in manifest.shards
    ]  # what `sha256sum` prints
    verify_contents(manifest)
    flip_a_bit(dst / "tokens-00004.bin", 1000)  # same size: the start's checks pass
    assert read_manifest(str(dst)) == manifest
    with pytest.raises(
        DataSourceError,
        match=r"shard .*tokens-00004.bin differs from what prepare wrote \(sha256 "
        r"[0-9a-f]{16}\.\.\., manifest.json says [0-9a-f]{16}\.\.\.\): it was "
        r"damaged or changed after prepare; re-run `python -m training.data",
    ):
        verify_contents(manifest)


def test_verify_of_a_manifest_without_shard_hashes_checks_the_whole_stream(prepared):
    _, dst = prepared
    record = json.loads((dst / MANIFEST).read_text())
    for shard in record["shards"]:
        del shard["sha256"]  # as prepare wrote it before shards had their own hash
    (dst / MANIFEST).write_text(json.dumps(record))
    manifest = read_manifest(str(dst))
    assert {s.sha256 for s in manifest.shards} == {None}
    verify_contents(manifest)
    flip_a_bit(dst / "tokens-00007.bin", 3)
    with pytest.raises(
        DataSourceError,
        match=r"the shards of .*prepared differ from what prepare wrote .*a shard "
        r"was damaged or changed after prepare, or manifest.json was edited",
    ):
        verify_contents(manifest)


def set_token(shard: Path, at: int, value: int) -> None:
    """Token ``at`` of ``shard`` becomes ``value``, in place (the file keeps its size: the start's checks pass)."""
    with open(shard, "r+b") as f:
        f.seek(at * 2)
        f.write(value.to_bytes(2, "little", signed=True))


# What one flipped bit makes of the byte token 112 ('m'): past the vocabulary, negative, a sentinel; PAD and UNK
# (ids below the bytes) are no stream's either.
@pytest.mark.parametrize("value", [112 | 1 << 14, 112 - (1 << 15), 112 | 1 << 8, 0, 2])
@pytest.mark.parametrize("shard, at", [(5, 123), (3, 0)])  # inside a shard; its first token, in a window that
def test_a_token_id_no_stream_holds_is_refused_where_it_is_read_naming_the_shard_and_fix(prepared, value, shard, at):
    _, dst = prepared  # straddles the boundary
    name = dst / f"tokens-{shard:05d}.bin"
    set_token(name, at, value)
    ds = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=0)
    sample = (shard * SHARD + at) // ds.raw_len
    with pytest.raises(DataSourceError) as e:
        ds[1, sample]  # before: an IndexError in the embedding (or, for a sentinel, silent training on it)
    assert str(e.value) == (
        f"shard {name} at token {at} (byte {2 * at}) holds token id {value}, which no token stream holds (only 1 and "
        f"3..258; the vocabulary has 384): the shard was damaged after prepare; check the directory with `python -m "
        f"training.data verify {dst}`, then re-run `python -m training.data prepare SRC {dst}` (or copy the prepared "
        "directory again, completely)"
    )
    ds[1, sample - 1], ds[1, sample + 1]  # the other samples read as before
    with pytest.raises(DataSourceError, match=f"shard {name} differs from what prepare wrote"):
        verify_contents(read_manifest(str(dst)))  # the command the message names finds the same shard


def test_the_verify_command_exits_0_for_intact_and_2_for_damaged_naming_the_fix(prepared, tmp_path, capsys):
    _, dst = prepared

    def run(directory) -> tuple[int, str, str]:
        code = main(["verify", str(directory)])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = run(dst)
    manifest = read_manifest(str(dst))
    assert (code, err) == (0, "") and out.startswith(
        f"verified {dst}: {manifest.tokens:,} tokens in {len(manifest.shards)} shard(s) match each shard's sha256 "
        f"and the sha256 {manifest.sha256[:16]}... that prepare recorded ("
    )
    flip_a_bit(dst / "tokens-00000.bin", 0)
    code, out, err = run(dst)
    assert (code, out) == (2, "") and err.startswith(f"error: shard {dst / 'tokens-00000.bin'} differs")
    code, out, err = run(tmp_path / "nothing")
    assert (
        (code, out) == (2, "")
        and "is not a prepared directory (no manifest.json, no shard files); pass the "
        "DST of `python -m training.data prepare SRC DST`"
        in err
    )
    (dst / "tokens-00000.bin").unlink()
    code, out, err = run(dst)
    assert code == 2 and "tokens-00000.bin (listed in manifest.json) cannot be read" in err


def test_job_check_accepts_a_prepared_directory_and_counts_its_samples(prepared):
    src, dst = prepared
    facts = check_data(DataConfig(source=str(dst), seq_len=64), min_samples=4)
    tokens = len(build_dataset(DataConfig(source=str(src), seq_len=64), seed=0).tokens)
    assert (facts.files, facts.tokens, facts.documents, facts.complete) == (
        len(read_manifest(str(dst)).shards),
        tokens,
        60,
        True,
    )
    with pytest.raises(DataSourceError, match=rf"holds {tokens:,} tokens .*train.global_batch=1000 needs 70,000"):
        check_data(DataConfig(source=str(dst), seq_len=64), min_samples=1000)


def test_the_command_refuses_bad_input_naming_it_and_the_fix(tmp_path, capsys):
    src = corpus(tmp_path / "c.jsonl")

    def run(*args: str) -> tuple[int, str]:
        code = main(["prepare", *args])
        out = capsys.readouterr()
        return code, out.out + out.err

    assert run(str(tmp_path / "nope.jsonl"), str(tmp_path / "d")) == (
        2,
        f"error: SRC='{tmp_path / 'nope.jsonl'}' does not exist; pass a .jsonl file (one JSON object per "
        "line), a .parquet file, a directory of them, or 'builtin'\n",
    )
    assert not (tmp_path / "d").exists()  # nothing written for a bad SRC
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, out = run(str(src), str(tmp_path / "other"))
    assert code == 2 and "exists and is not a prepared directory (it holds notes.txt); pass a new or empty" in out
    code, out = run(str(src), str(src))
    assert code == 2 and "is a file; pass a directory path" in out
    code, out = run(str(src), str(tmp_path / "p"), "--shard-tokens", "300")
    assert code == 0 and "train with --data.source" in out and (tmp_path / "p" / MANIFEST).exists()
    code, out = run(str(src), str(tmp_path / "p"))
    assert code == 2 and "already holds a prepared corpus; pass --overwrite" in out
    code, out = run(str(tmp_path / "p"), str(tmp_path / "q"))
    assert code == 2 and f"is already a prepared directory; train from it: --data.source {tmp_path / 'p'}" in out
    (tmp_path / "p" / MANIFEST).unlink()  # half-written: re-running prepare is the fix, without --overwrite
    code, out = run(str(src), str(tmp_path / "p"), "--shard-tokens", "500")
    manifest = read_manifest(str(tmp_path / "p"))
    assert code == 0 and manifest.shard_tokens == 500
    # the surplus 300-token shards are gone, not left beside the new ones
    assert sorted(os.listdir(tmp_path / "p")) == sorted([MANIFEST, *(s.name for s in manifest.shards)])
    assert run(str(src), str(tmp_path / "p"), "--overwrite")[0] == 0
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), str(tmp_path / "r"), "--shard-tokens", "0"])
    assert e.value.code == 2 and "'0' is not a positive number of tokens" in capsys.readouterr().err


def test_prepare_names_its_own_text_field_option(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = corpus(tmp_path / "c.jsonl")
    pq.write_table(
        pa.table({"id": list(range(50)), "body": ["the quick brown fox. " * 20] * 50}), tmp_path / "t.parquet"
    )
    for src, field, problem in (
        (jsonl, "body", f"{jsonl}:1 has no field 'body' (its fields: text)"),
        (tmp_path / "t.parquet", "text", f"{tmp_path / 't.parquet'} has no column 'text' (its columns: id, body)"),
        (tmp_path / "t.parquet", "id", f"{tmp_path / 't.parquet'} column 'id' is of type int64, not string"),
    ):
        assert main(["prepare", str(src), str(tmp_path / "p"), "--text-field", field]) == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert err.startswith(f"error: {problem}; set --text-field to ")  # was: --data.text_field, not prepare's
    assert main(["prepare", str(tmp_path / "t.parquet"), str(tmp_path / "p"), "--text-field", "body"]) == 0
    with pytest.raises(DataSourceError, match="set --data.text_field to "):  # training names its own option
        build_dataset(DataConfig(source=str(jsonl), text_field="body"), seed=0)

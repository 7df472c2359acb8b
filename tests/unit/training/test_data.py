"""Data position arithmetic, tokenizer equivalence, span corruption, the text a source holds, the corpus cache."""

import json
import logging
import random
from pathlib import Path

import pytest
import torch

from training.config import DataConfig
from training.data.corpus import DataSourceError, span_lengths
from training.data.dataset import (
    EOS,
    FIRST_SENTINEL,
    GlobalOrder,
    SpanCorruptionDataset,
    _split,
    _token_stream,
    build_dataset,
    cached_tokens,
    encode,
    raw_length_for,
)


def test_encode_matches_byt5_tokenizer():
    from transformers import ByT5Tokenizer

    text = "Exact resume — naïve checkpoints lose work."
    assert encode(text) == ByT5Tokenizer()(text, add_special_tokens=False)["input_ids"]


def test_every_global_batch_is_partitioned_across_ranks_at_any_world_size():
    order = GlobalOrder(num_samples=50, seed=3)
    for offset in (0, 8, 48, 96):  # 48 crosses an epoch boundary
        whole = order.rank_samples(offset, 8, 0, 1)
        for world in (2, 4, 8):
            parts = [i for r in range(world) for i in order.rank_samples(offset, 8, r, world)]
            assert parts == whole


def test_offsets_cover_each_epoch_exactly_once():
    order = GlobalOrder(num_samples=40, seed=1)
    seen = [order.sample(o)[1] for o in range(40)]
    assert sorted(seen) == list(range(40))
    assert [order.sample(o)[1] for o in range(40, 80)] != seen  # reshuffled next epoch


def test_resume_offset_equals_straight_run_across_world_size_change():
    """Steps 1-3 at world 2, then steps 4-6 at world 1 consume exactly the samples of 6 straight steps."""
    order, gb = GlobalOrder(num_samples=30, seed=9), 4
    straight = [i for step in range(6) for i in order.rank_samples(step * gb, gb, 0, 1)]
    before = [i for step in range(3) for r in range(2) for i in order.rank_samples(step * gb, gb, r, 2)]
    after = [i for step in range(3, 6) for i in order.rank_samples(step * gb, gb, 0, 1)]
    assert before + after == straight and len(set(straight[:30])) == min(30, len(straight))


def test_span_corruption_round_trip():
    cfg = DataConfig(seq_len=64)
    raw_len, tgt_len = raw_length_for(64, cfg.noise_density, cfg.mean_span_len)
    tokens = torch.tensor([3 + (i * 7) % 250 for i in range(raw_len * 5)], dtype=torch.int16)
    ds = SpanCorruptionDataset(tokens, cfg, seed=0)
    for i in range(len(ds)):
        s = ds[i]
        inp = s["input_ids"][s["attention_mask"].bool()].tolist()
        tgt = s["labels"][s["labels"] != -100].tolist()
        assert len(s["input_ids"]) == 64 and len(s["labels"]) == tgt_len
        assert inp[-1] == EOS and tgt[-1] == EOS and tgt[0] == FIRST_SENTINEL
        # Re-inserting each span at its sentinel restores the original window exactly.
        spans, cur = {}, None
        for t in tgt[:-1]:
            if t > 258:
                cur = t
                spans[cur] = []
            else:
                spans[cur].append(t)
        restored = [x for t in inp[:-1] for x in (spans[t] if t > 258 else [t])]
        assert restored == tokens[i * raw_len : (i + 1) * raw_len].tolist()
        assert ds[i]["input_ids"].equal(s["input_ids"])  # a pure function of the index


def test_builtin_corpus_is_real_text_and_deterministic():
    a, b = build_dataset(DataConfig(), seed=1), build_dataset(DataConfig(), seed=1)
    assert len(a) > 1000 and a.tokens.equal(b.tokens)
    text = bytes(int(t) - 3 for t in a.tokens[:2000] if 3 <= t < 259).decode("utf-8", "replace")
    assert sum(w in text.split() for w in ("the", "a", "of", "is", "to")) >= 3


def test_jsonl_source(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join('{"text": "%s"}' % ("sentence number %d. " % i * 20) for i in range(20)))
    ds = build_dataset(DataConfig(source=str(f)), seed=0)
    assert len(ds) >= 10


def test_token_stream_is_each_documents_encoding_then_eos():
    docs = ["plain", "", "naïve — ünïcödé ✓ 𝄞", "ÿ\x7f"]  # multi-byte characters; an empty document: one EOS
    assert _token_stream(docs).tolist() == [t for d in docs for t in (*encode(d), EOS)]
    assert _token_stream(docs).dtype == torch.int16


def _synthetic_dataset(seed: int) -> SpanCorruptionDataset:
    cfg = DataConfig(seq_len=64)
    raw_len, _ = raw_length_for(64, cfg.noise_density, cfg.mean_span_len)
    return SpanCorruptionDataset(
        torch.tensor([3 + (i * 7) % 250 for i in range(raw_len * 40)], dtype=torch.int16), cfg, seed=seed
    )


def test_first_epoch_noise_is_the_original_per_sample_seed():
    ds = _synthetic_dataset(seed=5)
    for i in range(len(ds)):
        # The input the original formula gives: seed * 1_000_003 + i, whatever the epoch count.
        raw = ds.tokens[i * ds.raw_len : (i + 1) * ds.raw_len].tolist()
        rng = random.Random(5 * 1_000_003 + i)
        noise, spans = span_lengths(len(raw), ds.cfg.noise_density, ds.cfg.mean_span_len)
        noise_lens, keep_lens = _split(noise, spans, rng), _split(len(raw) - noise, spans, rng)
        expected, pos = [], 0
        for s, (k, m) in enumerate(zip(keep_lens, noise_lens)):
            expected += [*raw[pos : pos + k], FIRST_SENTINEL - s]
            pos += k + m
        sample = ds[0, i]
        assert sample["input_ids"][sample["attention_mask"].bool()].tolist() == expected + [EOS]
        assert ds[i]["input_ids"].equal(sample["input_ids"]) and ds[i]["labels"].equal(sample["labels"])


def test_each_epoch_draws_new_noise_over_the_same_window():
    ds = _synthetic_dataset(seed=5)
    differ = 0
    for i in range(len(ds)):
        e0, e1, e2 = ds[0, i], ds[1, i], ds[2, i]
        assert ds[1, i]["input_ids"].equal(e1["input_ids"])  # still a pure function of (epoch, index)
        differ += (not e0["input_ids"].equal(e1["input_ids"])) + (not e1["input_ids"].equal(e2["input_ids"]))
        # the same raw window: kept plus masked tokens are the same multiset in every epoch
        words = [
            sorted(t for t in torch.cat([s["input_ids"], s["labels"]]).tolist() if 3 <= t < 259) for s in (e0, e1, e2)
        ]
        assert words[0] == words[1] == words[2]
    assert differ >= 2 * len(ds) - 2  # two spans splits of ~70 tokens coincide by chance very rarely
    order = GlobalOrder(num_samples=len(ds), seed=1)
    assert [order.sample(o)[0] for o in (0, len(ds) - 1, len(ds), 2 * len(ds) + 3)] == [0, 0, 1, 2]


def parquet(path, **columns) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return str(path)


def test_a_parquet_text_field_that_is_not_strings_is_refused_naming_the_file_column_type_and_fix(tmp_path):
    ids = [1234567890123 + i for i in range(300)]
    source = parquet(tmp_path / "ids.parquet", text=ids, body=["words " * 60] * 300)
    with pytest.raises(DataSourceError) as e:
        build_dataset(DataConfig(source=source), seed=0)
    assert str(e.value) == (
        f"{source} column 'text' is of type int64, not string; set --data.text_field to a column "
        "of text (its string columns: body)"
    )  # was: trained on the integers' digits
    assert len(build_dataset(DataConfig(source=source, text_field="body", seq_len=64), seed=0)) > 100


def test_parquet_string_columns_of_every_arrow_kind_are_text_and_nulls_are_no_document(tmp_path):
    import pyarrow as pa

    texts = [f"document {i}: " + "the quick brown fox. " * 10 for i in range(30)]
    expected = _token_stream(texts)
    for kind in (pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())):
        column = pa.array([*texts[:10], None, *texts[10:]]).cast(kind)
        source = parquet(tmp_path / f"{kind}.parquet".replace("<", "").replace(">", ""), text=column)
        assert build_dataset(DataConfig(source=source, seq_len=64), seed=0).tokens.equal(expected), kind


@pytest.mark.parametrize(
    "value, kind",
    [(1234567, "number"), (2.5, "number"), (True, "boolean"), (["a", "b"], "array"), ({"k": "v"}, "object")],
)
def test_a_jsonl_text_field_that_is_not_a_string_is_refused_naming_the_line(tmp_path, value, kind):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "a real document. " * 20}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(DataSourceError) as e:
        build_dataset(DataConfig(source=str(f)), seed=0)
    assert str(e.value) == (
        f"{f}:2 field 'text' holds a JSON {kind} ({json.dumps(value)}), not a string; set "
        "--data.text_field to the field that holds the text"
    )  # was: str(value) as text


def test_a_jsonl_null_text_is_no_document_as_in_parquet(tmp_path):
    docs = [f"document {i}: " + "the quick brown fox. " * 10 for i in range(30)]
    f = tmp_path / "c.jsonl"
    f.write_text(
        "".join(json.dumps({"text": d}) + "\n" for d in docs[:5])
        + '{"text": null}\n'
        + "".join(json.dumps({"text": d}) + "\n" for d in docs[5:])
    )
    assert build_dataset(DataConfig(source=str(f), seq_len=64), seed=0).tokens.equal(_token_stream(docs))  # not "None"


def corpus_stream() -> torch.Tensor:
    return _token_stream([f"document {i}: " + "naïve façade, the quick brown fox. " * 10 for i in range(300)])


def flip_a_token_byte(path: Path, tokens: torch.Tensor) -> None:
    """Flip a bit inside the tensor bytes of a torch.save file: the zip stays readable."""
    data = bytearray(path.read_bytes())
    at = data.find(tokens.numpy().tobytes()[:256])
    assert at > 0
    data[at + 1000] ^= 0x04
    path.write_bytes(bytes(data))


DAMAGE = {
    "garbage": (lambda p, t: p.write_bytes(bytes(range(256)) * 20), "torch.load raised "),
    "truncated": (lambda p, t: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "torch.load raised "),
    "empty": (lambda p, t: p.write_bytes(b""), "torch.load raised EOFError"),
    "a bit flipped": (flip_a_token_byte, "its tokens differ from the sha256 recorded with them"),
    "another object": (lambda p, t: torch.save(t, p), "it holds no token stream"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_corpus_cache_is_rebuilt_with_one_warning(tmp_path, caplog, damage):
    path, builds = tmp_path / "cache" / "corpus.pt", []

    def build() -> torch.Tensor:
        builds.append(1)
        return corpus_stream()

    stream = cached_tokens(str(path), build, "a test corpus")
    assert cached_tokens(str(path), build, "a test corpus").equal(stream) and len(builds) == 1  # cached
    spoil, why = DAMAGE[damage]
    spoil(path, stream)
    with caplog.at_level(logging.WARNING, logger="training.data"):
        assert cached_tokens(str(path), build, "a test corpus").equal(stream)
    assert len(builds) == 2 and len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith(f"WARNING: the cache of a test corpus, {path}, is damaged ({why}")
    assert caplog.records[0].getMessage().endswith("); rebuilding it")
    caplog.clear()
    assert cached_tokens(str(path), build, "a test corpus").equal(stream) and len(builds) == 2  # rewritten, valid
    assert not caplog.records


def test_a_corpus_cache_that_is_absent_or_unwritable_is_built_without_a_warning(tmp_path, caplog):
    (tmp_path / "a file").write_text("")
    with caplog.at_level(logging.WARNING, logger="training.data"):
        for path in (tmp_path / "new" / "corpus.pt", tmp_path / "a file" / "corpus.pt"):
            assert cached_tokens(str(path), corpus_stream, "a test corpus").equal(corpus_stream())
    assert not caplog.records

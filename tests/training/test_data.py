"""Data position arithmetic, tokenizer equivalence and span corruption."""
import torch

from training.config import DataConfig
from training.data import (EOS, FIRST_SENTINEL, GlobalOrder, SpanCorruptionDataset, build_dataset, encode,
                           raw_length_for)


def test_encode_matches_byt5_tokenizer():
    from transformers import ByT5Tokenizer
    text = "Exact resume — naïve checkpoints lose work."
    assert encode(text) == ByT5Tokenizer()(text, add_special_tokens=False)["input_ids"]


def test_every_global_batch_is_partitioned_across_ranks_at_any_world_size():
    order = GlobalOrder(num_samples=50, seed=3)
    for offset in (0, 8, 48, 96):  # 48 crosses an epoch boundary
        whole = order.rank_indices(offset, 8, 0, 1)
        for world in (2, 4, 8):
            parts = [i for r in range(world) for i in order.rank_indices(offset, 8, r, world)]
            assert parts == whole


def test_offsets_cover_each_epoch_exactly_once():
    order = GlobalOrder(num_samples=40, seed=1)
    seen = [order.index(o) for o in range(40)]
    assert sorted(seen) == list(range(40))
    assert [order.index(o) for o in range(40, 80)] != seen  # reshuffled next epoch


def test_resume_offset_equals_straight_run_across_world_size_change():
    """Steps 1-3 at world 2, then steps 4-6 at world 1 consume exactly the samples of 6 straight steps."""
    order, gb = GlobalOrder(num_samples=30, seed=9), 4
    straight = [i for step in range(6) for i in order.rank_indices(step * gb, gb, 0, 1)]
    before = [i for step in range(3) for r in range(2) for i in order.rank_indices(step * gb, gb, r, 2)]
    after = [i for step in range(3, 6) for i in order.rank_indices(step * gb, gb, 0, 1)]
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
        assert restored == tokens[i * raw_len:(i + 1) * raw_len].tolist()
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

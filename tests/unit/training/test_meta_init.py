"""Meta-device init: each rank materialises only its shards, and the weights equal a CPU build's, bitwise."""

from __future__ import annotations


import pytest
import torch

from training.config import ModelConfig
from training.model.meta_init import MetaInitUnsupported, record_init
from training.model.t5 import BuiltOnCpu, build_model, build_model_for_sharding, record_or_build

# Odd sizes, so shards are uneven across 3 ranks (64 rows -> 22/21/21, vocab 384 -> 128 each, d_ff 96 -> 32).
SMALL = dict(d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4)


def test_meta_build_replayed_unsharded_equals_the_cpu_build_and_leaves_the_rng_where_it_did():
    built = build_model_for_sharding(ModelConfig(**SMALL), seed=5)
    assert all(p.is_meta for p in built.model.parameters())
    torch.rand(3)  # whatever runs between build and materialise (sharding, a peer's check) may draw numbers
    built.materialize(built.model, torch.device("cpu"))
    after_meta = torch.random.get_rng_state()
    cpu = build_model(ModelConfig(**SMALL), seed=5)
    after_cpu = torch.random.get_rng_state()
    ours, ref = built.model.state_dict(), cpu.state_dict()
    assert ours.keys() == ref.keys()
    assert [k for k in ref if not torch.equal(ours[k], ref[k])] == []
    assert torch.equal(after_meta, after_cpu)  # dropout and anything else seeded later see the same stream
    # A different seed gives different weights: the replay follows the seed, it does not copy a fixed model.
    other = build_model_for_sharding(ModelConfig(**SMALL), seed=6)
    other.materialize(other.model, torch.device("cpu"))
    assert not torch.equal(other.model.shared.weight, ours["shared.weight"])


def test_weights_allocated_then_drawn_after_a_restore_found_nothing_equal_the_cpu_build():
    """The trainer allocates first and draws the seed's weights only when no restore filled them: drawn later,
    after other draws, they are still bitwise the CPU build's, and the generator ends where the CPU build leaves it."""
    built = build_model_for_sharding(ModelConfig(**SMALL), seed=5)
    built.allocate(built.model, torch.device("cpu"))
    assert not any(p.is_meta for p in built.model.parameters())
    torch.rand(7)  # a restore that found nothing ran in between
    built.initialize(built.model)
    after_meta = torch.random.get_rng_state()
    cpu = build_model(ModelConfig(**SMALL), seed=5)
    ours, ref = built.model.state_dict(), cpu.state_dict()
    assert [k for k in ref if not torch.equal(ours[k], ref[k])] == []
    assert torch.equal(after_meta, torch.random.get_rng_state())


class _PartWrite(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, padding_idx=0)  # reset_parameters zeroes one row (a view)


class _FactoryOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = torch.nn.Parameter(torch.ones(3))  # its value comes from the factory, which is not replayed


class _WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)


@pytest.mark.parametrize(
    "module, says",
    [(_PartWrite, "writes part of emb.weight"), (_FactoryOnly, "nothing writes scale"), (_WithBuffer, "buffers")],
)
def test_a_construction_the_replay_cannot_reproduce_is_refused_with_the_reason(module, says):
    with pytest.raises(MetaInitUnsupported, match=says):
        record_init(module, seed=0)


def test_a_plain_module_replays_exactly():
    built = record_init(lambda: torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)), seed=9)
    built.materialize(built.model, torch.device("cpu"))
    torch.manual_seed(9)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 2))
    assert all(torch.equal(a, b) for a, b in zip(built.model.parameters(), ref.parameters()))


def test_pretrained_weights_are_still_loaded_on_the_cpu(tmp_path):
    build_model(ModelConfig(**SMALL), seed=1).save_pretrained(tmp_path)
    built = build_model_for_sharding(ModelConfig(**SMALL, init_from=str(tmp_path)), seed=1)
    assert isinstance(built, BuiltOnCpu) and not any(p.is_meta for p in built.model.parameters())


class _NeedsValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, int(torch.arange(4).sum().item()))  # a value from a tensor it made


@pytest.mark.parametrize("module", [_NeedsValues, _FactoryOnly])
def test_a_construction_meta_init_cannot_reproduce_is_built_on_the_cpu_with_the_same_weights(module, caplog):
    built = record_or_build(module, seed=4)
    assert isinstance(built, BuiltOnCpu) and "building the model on the CPU" in caplog.text
    torch.manual_seed(4)
    ref = module()
    assert all(torch.equal(a, b) for a, b in zip(built.model.parameters(), ref.parameters()))

"""T5 attention with the position bias on SDPA ('sdpa_bias') against eager, what the kernel is handed, and
regional compilation (each T5 block compiled in place) against the uncompiled model."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh

from training.model.attention import SDPA_BIAS
from training.model.compile import apply_regional_compile
from training.config import ParallelConfig
from training.model.t5 import apply_activation_checkpointing, apply_fsdp

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_attention import batch, t5


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2 gradients are DTensors


def train_two_steps(model) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Loss and gradients of two SGD steps on the same batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(2):
        loss = model(**batch()).loss
        loss.backward()
        out.append((loss.item(), {n: full(p.grad).clone() for n, p in model.named_parameters()}))
        opt.step()
        opt.zero_grad()
    return out


def assert_same_training(compiled, reference) -> None:
    for (loss, grads), (ref_loss, ref_grads) in zip(compiled, reference):
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


TINY = dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4, dropout=0.0)


def test_regional_compile_trains_like_the_uncompiled_model():
    torch._dynamo.reset()
    counters.clear()
    reference = train_two_steps(t5(SDPA_BIAS, **TINY))
    model = t5(SDPA_BIAS, **TINY)
    assert apply_regional_compile(model, False) == 0 and model.encoder.block[0]._compiled_call_impl is None
    assert apply_regional_compile(model, True) == 2
    assert_same_training(train_two_steps(model), reference)
    assert counters["stats"]["unique_graphs"] == 2  # the encoder block and the decoder block, each compiled once


@pytest.fixture
def world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_regional_compile_composes_with_activation_checkpointing_and_fsdp2(world_of_one):
    """The trainer's order: checkpointing, compile, fully_shard. Padding in the batch: the case that Inductor's
    vectorised CPU kernels get wrong for the position bias's gradient (training/model/compile.py)."""
    torch._dynamo.reset()
    counters.clear()

    def build(compiled: bool):
        model = t5(SDPA_BIAS, **TINY)
        apply_activation_checkpointing(model)
        apply_regional_compile(model, compiled)
        apply_fsdp(model, world_of_one, ParallelConfig())
        return model

    reference = train_two_steps(build(False))
    assert_same_training(train_two_steps(build(True)), reference)
    assert counters["stats"]["unique_graphs"] >= 1  # the encoder block (see compile.py for the decoder's)

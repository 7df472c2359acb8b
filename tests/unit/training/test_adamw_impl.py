"""train.adamw_impl (training/job/optimizer.py): 'fused' is the optimizer every run used before the setting, bitwise;
'foreach' and 'for_loop' are the same maths (bitwise equal to each other on the CPU, a few ulps from fused)."""

from __future__ import annotations

import pytest
import torch

from training.config import ConfigError, load_config
from training.job.optimizer import IMPLS, build_adamw


def trained(make_optimizer) -> torch.Tensor:
    """Parameters of a small MLP after three AdamW steps (weight decay on, as the presets have it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = make_optimizer(model.parameters())
    x = torch.randn(8, 16)
    for _ in range(3):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def with_impl(impl):
    return trained(lambda params: build_adamw(params, lr=1e-2, weight_decay=0.01, impl=impl))


def test_default_is_the_fused_adamw_the_trainer_always_built_bitwise():
    assert load_config([]).train.adamw_impl == "fused"
    before = trained(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95), fused=True))
    assert torch.equal(with_impl("fused"), before)


def test_the_implementations_compute_the_same_update():
    got = {impl: with_impl(impl) for impl in IMPLS}
    assert torch.equal(got["foreach"], got["for_loop"])
    assert not torch.equal(got["fused"], got["foreach"])  # fused rounds differently: the settings are distinct
    torch.testing.assert_close(got["fused"], got["foreach"], rtol=1e-6, atol=1e-6)


def test_an_unknown_impl_is_one_line_naming_the_choices():
    assert load_config(["--train.adamw_impl", "foreach"]).train.adamw_impl == "foreach"
    with pytest.raises(ConfigError, match="train.adamw_impl='apex': use fused, foreach or for_loop"):
        load_config(["--train.adamw_impl", "apex"])
    with pytest.raises(ValueError, match="train.adamw_impl='apex'"):
        build_adamw([torch.nn.Parameter(torch.zeros(1))], lr=1e-3, weight_decay=0.0, impl="apex")

"""The local-shard gradient clip (training/job/grad_clip.py) and optimizer step (training/job/optimizer.py) on plain
tensors, where they must be torch's own: one process, no mesh. Their DTensor side, on two real ranks:
tests/integration/training/test_shard_local_step.py."""

from __future__ import annotations

import pytest
import torch

from training.job.grad_clip import clip_grad_norm
from training.job.optimizer import IMPLS, ShardLocalAdamW, build_adamw


def params_with_grads(scale: float) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((4, 3), (7,), (2, 2, 2))]
    for p in params:
        p.grad = torch.randn_like(p) * scale
    return params


@pytest.mark.parametrize("max_norm", [0.5, float("inf")])
def test_the_clip_gives_torchs_norm_and_scaled_gradients(max_norm):
    ours, theirs = params_with_grads(3.0), params_with_grads(3.0)
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6) and norm.item() > 0.5
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)


def test_a_non_finite_gradient_gives_a_non_finite_norm_for_the_guard():
    params = params_with_grads(1.0)
    params[1].grad[0] = float("nan")
    assert not torch.isfinite(clip_grad_norm(params, 1.0))


def test_no_gradient_gives_a_zero_norm():
    assert clip_grad_norm([torch.nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


@pytest.mark.parametrize("impl", IMPLS)
def test_the_optimizer_is_torchs_adamw_bit_for_bit_with_its_state(impl):
    flags = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False)}[impl]
    ours, theirs = params_with_grads(1.0), params_with_grads(1.0)
    opt_ours = build_adamw(ours, lr=1e-2, weight_decay=0.1, impl=impl)
    opt_theirs = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), **flags)
    assert isinstance(opt_ours, ShardLocalAdamW)
    for _ in range(3):
        opt_ours.step()
        opt_theirs.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    for mine, torchs in zip(opt_ours.state_dict()["state"].values(), opt_theirs.state_dict()["state"].values()):
        assert mine.keys() == torchs.keys()
        for k in mine:
            assert torch.equal(mine[k], torchs[k]) and (mine[k].dtype, mine[k].device) == (
                torchs[k].dtype,
                torchs[k].device,
            )


def test_settings_the_local_step_does_not_take_are_refused_by_name():
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        ShardLocalAdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3, amsgrad=True)

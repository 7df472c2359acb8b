"""Canary for ``torch_private.optimizer_step_unless``: fused AdamW reads ``found_inf`` and, where it is set, leaves
every piece of its state as it was; where it is clear, the step is bitwise the plain ``step()``."""

from __future__ import annotations

import torch

from training.job.optimizer import build_adamw
from training.torch_private import optimizer_step_unless


def stepped(found_inf: float | None) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64))
    opt = build_adamw([w], lr=1e-2, weight_decay=0.1, impl="fused")
    for _ in range(2):  # a first step creates the moments; the second is the one under test
        w.grad = torch.randn(64)
        if found_inf is None or not opt.state:
            opt.step()
        else:
            optimizer_step_unless(opt, torch.tensor(found_inf))
    return w.detach().clone(), {k: v.clone() for k, v in opt.state[w].items()}


def test_a_set_flag_skips_the_whole_update_and_a_clear_one_is_the_plain_step():
    torch.manual_seed(0)
    w0 = torch.nn.Parameter(torch.randn(64))
    opt = build_adamw([w0], lr=1e-2, weight_decay=0.1, impl="fused")
    w0.grad = torch.randn(64)
    opt.step()
    after_one = w0.detach().clone(), {k: v.clone() for k, v in opt.state[w0].items()}

    skipped_w, skipped_state = stepped(1.0)
    assert torch.equal(skipped_w, after_one[0])
    assert all(torch.equal(skipped_state[k], after_one[1][k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    clear_w, clear_state = stepped(0.0)
    plain_w, plain_state = stepped(None)
    assert torch.equal(clear_w, plain_w) and all(torch.equal(clear_state[k], plain_state[k]) for k in plain_state)
    assert not torch.equal(clear_w, skipped_w)

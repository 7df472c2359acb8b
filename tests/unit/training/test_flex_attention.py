"""T5 on FlexAttention ('flex', training/model/flex.py) against eager: same loss and gradients in fp32 for encoder,
causal decoder and cross-attention, with and without padding and activation checkpointing; decoding with a cache;
a resume in the flex path bitwise equal to its uninterrupted run; the settings it refuses."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.training.test_attention import batch, bias_grads, step, t5
from training.config import ConfigError, load_config
from training.model.flex import FLEX
from training.model.t5 import apply_activation_checkpointing

# fp32 on the CPU: the reference implementation computes the scores in fp32 like eager, so the logits agree to
# rounding of the softmax's order of operations, the gradients to a few ulps of their largest entries.
LOGITS_TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)
ONE_BLOCK = dict(num_layers=1, num_decoder_layers=1)  # where two blocks add nothing but time


@pytest.mark.parametrize(
    "masks, checkpointing",
    [
        (dict(encoder_padding=True, decoder_padding=True), False),  # padding block masks in all three attentions
        (dict(encoder_padding=False, decoder_padding=False), False),  # what the trainer passes: causal mask only
        (dict(encoder_padding=True, decoder_padding=True), True),  # checkpointing recomputes each block
    ],
)
def test_flex_matches_eager_in_fp32(masks, checkpointing):
    inputs = batch(**masks)

    def build(attention):
        model = t5(attention)
        if checkpointing:
            apply_activation_checkpointing(model)
        return model

    logits, grads = step(build(FLEX), inputs)
    ref_logits, ref_grads = step(build("eager"), inputs)
    torch.testing.assert_close(logits, ref_logits, **LOGITS_TOL)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **GRAD_TOL, msg=name)
    # the position bias's gradient reached both tables (encoder's and decoder's), through the score_mod
    assert len(bias_grads(grads)) == 2 and all(g.abs().sum() > 0 for g in bias_grads(grads))


def test_decoding_with_a_cache_matches_eager():
    """No gradient: the public flex_attention; one query at a time, the causal mask offset to the cached keys."""
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    out = {
        a: t5(a, **ONE_BLOCK)
        .eval()
        .generate(**inputs, max_new_tokens=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
        for a in (FLEX, "eager")
    }
    assert torch.equal(out[FLEX].sequences, out["eager"].sequences)
    torch.testing.assert_close(torch.stack(out[FLEX].scores), torch.stack(out["eager"].scores), **LOGITS_TOL)


def train(model, opt, inputs, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_a_resume_in_the_flex_path_is_bitwise_its_uninterrupted_run():
    inputs = batch(encoder_padding=False)
    model = t5(FLEX, **ONE_BLOCK)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    train(model, opt, inputs, 1)  # the optimizer state exists from here on
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    uninterrupted = train(model, opt, inputs, 1)

    resumed = t5(FLEX, **ONE_BLOCK)
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-2, fused=True)
    resumed.load_state_dict(saved[0])
    resumed_opt.load_state_dict(saved[1])
    assert train(resumed, resumed_opt, inputs, 1) == uninterrupted
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_flex_is_a_setting_and_refuses_dropout_in_one_line():
    assert load_config(["--model.attention", "flex", "--model.dropout", "0"]).model.attention == FLEX
    with pytest.raises(ConfigError, match=r"model.dropout=0.1 with model.attention=flex: .* use --model.dropout 0"):
        load_config(["--model.attention", "flex", "--model.dropout", "0.1"])
    model = t5(FLEX, dropout=0.25)  # built directly (no config check): the kernel itself refuses
    with pytest.raises(ValueError, match="model.attention=flex has no attention dropout"):
        model(**batch())


def test_the_kernel_reads_the_bias_once_per_head_not_per_sample(monkeypatch):
    """Self-attention hands flex the [1, H, Sq, Sk] bias (the score_mod indexes its batch 0), cross-attention none."""
    import training.model.flex as flex

    seen = []
    real = flex.run_flex

    def spy(query, key, value, score_mod, buffers, block_mask):
        seen.append((query.shape, [b.shape for b in buffers], block_mask is None))
        return real(query, key, value, score_mod, buffers, block_mask)

    monkeypatch.setattr(flex, "run_flex", spy)
    step(t5(FLEX), batch(encoder_padding=False))
    b, h, s, t = 3, 4, 20, 9
    encoder = [(torch.Size([b, h, s, 8]), [torch.Size([1, h, s, s])], True)] * 2  # unpadded: no block mask
    decoder = [
        (torch.Size([b, h, t, 8]), [torch.Size([1, h, t, t])], False),  # causal
        (torch.Size([b, h, t, 8]), [], True),  # cross: no bias, no mask
    ] * 2
    assert seen == encoder + decoder

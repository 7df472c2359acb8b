"""The forward/backward of a training step reads no device value back on the host (issue 51, lever 3): counted on
the CPU as the reads a GPU would wait for (``aten._local_scalar_dense``: ``.item()``, ``float()``, ``bool()`` of a
tensor), with a dispatch mode that sees every op the model runs."""

from __future__ import annotations

import pytest
import torch

from tests.unit.training.test_attention import t5
from training.job.trainer import padding_mask_or_none
from training.torch_private import dispatch_mode_and_tree_map

TorchDispatchMode, _ = dispatch_mode_and_tree_map()


class HostReads(TorchDispatchMode):
    """Counts the ops that copy a tensor's value to the host (on a GPU: a wait for the device)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def forward_backward(model, mask) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """Host reads, logits and gradients of one micro-batch as Trainer._step runs it."""
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(3, 384, (2, 20), generator=g), torch.randint(3, 384, (2, 9), generator=g)
    with HostReads() as reads:
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=model._shift_right(labels)).logits
        torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), reduction="sum").backward()
    return reads.count, logits.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("attention", ["eager", "sdpa_bias"])  # the GPU presets' kernel and the fused-kernel one
def test_an_unpadded_batch_reaches_the_model_without_a_mask_and_nothing_waits_for_the_device(attention):
    ones = torch.ones(2, 20, dtype=torch.long)
    assert padding_mask_or_none(ones) is None
    reads, logits, grads = forward_backward(t5(attention), padding_mask_or_none(ones))
    assert reads == 0
    # What the trainer handed before: transformers reads the all-ones mask back (encoder and cross-attention),
    # and computes bitwise the same.
    reads_before, logits_before, grads_before = forward_backward(t5(attention), ones)
    assert reads_before == 2
    assert torch.equal(logits, logits_before) and all(map(torch.equal, grads, grads_before))


def test_a_padded_batch_keeps_its_mask():
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 15:] = 0
    assert padding_mask_or_none(mask) is mask

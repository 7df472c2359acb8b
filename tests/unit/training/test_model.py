"""Model construction: the attention setting picks the kernel and changes nothing else."""

from __future__ import annotations

import torch

from training.model.attention import CHOICES
from training.config import ModelConfig, load_config
from training.model.t5 import build_model

SMALL = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, dropout=0.0)


def test_attention_setting_selects_the_kernel_and_keeps_weights_and_outputs():
    models = {a: build_model(ModelConfig(**SMALL, attention=a), seed=3).eval() for a in CHOICES}
    assert {a: m.config._attn_implementation for a, m in models.items()} == {a: a for a in CHOICES}
    ea = models["eager"].state_dict()
    for a in CHOICES:
        sd = models[a].state_dict()
        assert sd.keys() == ea.keys() and all(torch.equal(sd[k], ea[k]) for k in sd), a
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 384, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0  # padding exercises the mask path of both kernels
    dec = torch.randint(3, 384, (2, 8), generator=g)
    with torch.no_grad():
        out = {a: m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits for a, m in models.items()}
    for a in CHOICES:
        torch.testing.assert_close(out[a], out["eager"], rtol=1e-5, atol=1e-5)


def test_gpu_presets_use_eager_attention_and_cpu_presets_keep_the_default():
    for preset in ("t5-small", "t5-base", "t5-large", "t5-3b"):
        assert load_config(["--preset", preset]).model.attention == "eager", preset
    for preset in ("debug", "t5-60m"):
        assert load_config(["--preset", preset]).model.attention == "sdpa", preset

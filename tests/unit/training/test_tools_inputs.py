"""Bad inputs to the checkpoint tools (training.compare, training.export) and to --model.init_from: one line that
names the input and what is wrong with it, exit 2 (3 for weights of another model shape), never a traceback and
never a damaged checkpoint compared as if it were sound."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from training.config import ConfigError, ModelConfig
from training.errors import CheckpointIncompatible, exit_code
from training.model.t5 import build_model
from training.model.pretrained import check_pretrained_dir

SMALL = dict(d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)


# ---- case 4: --model.init_from without weights, or of another shape --------------------------------------------
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrained")
    build_model(ModelConfig(**SMALL), seed=0).save_pretrained(out)
    return out


def config_only(pretrained: Path, where: Path) -> Path:
    where.mkdir()
    shutil.copy(pretrained / "config.json", where)
    return where


@pytest.mark.parametrize(
    "make, missing",
    [
        (
            lambda pre, tmp: tmp / "empty",
            "has neither config.json nor weights (model.safetensors or pytorch_model.bin)",
        ),
        (
            lambda pre, tmp: config_only(pre, tmp / "config_only"),
            "has no weights (model.safetensors or pytorch_model.bin)",
        ),
    ],
)
def test_init_from_without_weights_is_a_config_error_naming_the_directory(pretrained, tmp_path, make, missing):
    (tmp_path / "empty").mkdir()
    path = str(make(pretrained, tmp_path))
    cfg = ModelConfig(**SMALL, init_from=path)
    for check in (lambda: check_pretrained_dir(path, cfg), lambda: build_model(cfg, seed=0)):
        with pytest.raises(ConfigError) as e:
            check()
        assert exit_code(e.value) == 2
        assert f"model.init_from={path!r} {missing}" in str(e.value) and "config.json and model.safetensors" in str(
            e.value
        )


def test_init_from_of_another_shape_is_exit_3_naming_the_field_and_the_fix(pretrained):
    cfg = ModelConfig(**{**SMALL, "d_model": 32}, init_from=str(pretrained))
    for check in (lambda: check_pretrained_dir(str(pretrained), cfg), lambda: build_model(cfg, seed=0)):
        with pytest.raises(CheckpointIncompatible) as e:
            check()
        assert exit_code(e.value) == 3
        assert "d_model=16 (this run: 32)" in str(e.value) and "--model.d_model 16" in str(e.value)


def test_init_from_whose_weights_do_not_fit_its_own_config_or_are_cut_short(pretrained, tmp_path):
    import json

    liar = tmp_path / "liar"  # config.json of this run's shape, weights of another
    shutil.copytree(pretrained, liar)
    config = json.loads((liar / "config.json").read_text())
    (liar / "config.json").write_text(json.dumps({**config, "d_model": 32}))
    with pytest.raises(CheckpointIncompatible, match="holds weights of another shape than its config.json says"):
        build_model(ModelConfig(**{**SMALL, "d_model": 32}, init_from=str(liar)), seed=0)
    cut = tmp_path / "cut"
    shutil.copytree(pretrained, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=f"model.init_from={str(cut)!r} cannot be loaded"):
        build_model(ModelConfig(**SMALL, init_from=str(cut)), seed=0)


def test_init_from_a_good_directory_loads_its_weights(pretrained):
    loaded = build_model(ModelConfig(**SMALL, init_from=str(pretrained)), seed=1)
    reference = build_model(ModelConfig(**SMALL), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), reference.state_dict().values()))

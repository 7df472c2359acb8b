"""Bad inputs to the checkpoint tools (training.compare, training.export) and to --model.init_from: one line that
names the input and what is wrong with it, exit 2 (3 for weights of another model shape), never a traceback and
never a damaged checkpoint compared as if it were sound."""

from __future__ import annotations


import pytest

from tests.conftest import tiny_run
from training.config import ModelConfig
from training.model.t5 import build_model


@pytest.mark.e2e
def test_a_job_with_init_from_of_another_shape_stops_with_one_line_and_exit_3(tmp_path):
    """Through the real launcher (torchrun agent): no traceback, the job's exit code for another model."""
    tiny = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4)  # conftest.TINY
    other = tmp_path / "other_shape"
    build_model(ModelConfig(**{**tiny, "d_model": 32}), seed=0).save_pretrained(other)
    r = tiny_run(tmp_path / "run", 1, "--model.init_from", str(other), steps=1)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert len(errors) == 1 and "d_model=32 (this run: 64)" in errors[0] and "--model.d_model 32" in errors[0]

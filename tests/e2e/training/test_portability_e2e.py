"""Checkpoints a user can take elsewhere: a Hugging Face export, a chosen step, another run's weights."""

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, TINY_STEPS, tiny_run
from training.checkpoint import SUPERSEDED, step_dir
from training.compare import compare, load_full
from training.config import ModelConfig
from training.model.t5 import build_model

pytestmark = pytest.mark.e2e
TINY_MODEL = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4)


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_export_loads_in_transformers_with_the_trained_models_outputs(tiny_reference, tmp_path):
    from transformers import T5ForConditionalGeneration

    ckpt = step_dir(tiny_reference / "checkpoints", TINY_STEPS)
    r = subprocess.run(
        [sys.executable, "-m", "training.export", str(ckpt), str(tmp_path / "hf")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    exported = T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    trained = build_model(ModelConfig(**TINY_MODEL), seed=0).eval()
    trained.load_state_dict(
        {k[len("train.model.") :]: v for k, v in load_full(ckpt).items() if k.startswith("train.model.")}
    )
    ids = torch.randint(3, 259, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(3, 259, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = exported(input_ids=ids, labels=labels).logits
        b = trained(input_ids=ids, labels=labels).logits
    assert torch.equal(a, b)
    # a second export into the same directory refuses rather than overwrite
    r = subprocess.run(
        [sys.executable, "-m", "training.export", str(ckpt), str(tmp_path / "hf")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "is not empty" in r.stderr


def test_load_step_resumes_there_keeps_newer_ones_and_is_exact(tiny_reference, tmp_path):
    import shutil

    shutil.copytree(tiny_reference / "checkpoints", tmp_path / "checkpoints")
    r = tiny_run(tmp_path, 2, "--checkpoint.load_step", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from step 3" in r.stdout and "moved 2 newer checkpoint(s)" in r.stdout + r.stderr
    kept = sorted(p.name.split(".")[0] for p in (tmp_path / "checkpoints" / SUPERSEDED).iterdir())
    assert kept == ["step_00000006", "step_00000008"]
    final = step_dir(tmp_path / "checkpoints", TINY_STEPS)
    assert compare(step_dir(tiny_reference / "checkpoints", TINY_STEPS), final) == []
    # the same flags again (a restart): the roll-back is not repeated
    r = tiny_run(tmp_path, 2, "--checkpoint.load_step", "3")
    assert r.returncode == 0 and "already finished" in r.stdout, r.stdout + r.stderr
    r = tiny_run(tmp_path, 2, "--checkpoint.load_step", "5")
    assert "no complete checkpoint of step 5" in r.stderr


def test_initial_load_path_starts_a_new_run_from_another_runs_weights(tiny_reference, tmp_path):
    r = tiny_run(tmp_path, 2, "--checkpoint.initial_load_path", str(tiny_reference / "checkpoints"), steps=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"model weights from {tiny_reference / 'checkpoints'} (step {TINY_STEPS})" in r.stdout
    first = next(x for x in records(tmp_path) if x["event"] == "step")
    ref = {x["step"]: x for x in records(tiny_reference) if x["event"] == "step"}
    assert first["step"] == 1 and first["data_offset"] == 0  # a new run: fresh data position and schedule
    assert first["loss"] < ref[1]["loss"] - 0.5  # but trained weights, not a random init
    # Issue 29: the same flags again (a restart) resume the run's own checkpoint, and say the path is not used
    r = tiny_run(tmp_path, 2, "--checkpoint.initial_load_path", str(tiny_reference / "checkpoints"), steps=3)
    assert r.returncode == 0 and "resumed from step 2" in r.stdout, r.stdout + r.stderr
    assert (
        f"checkpoint.initial_load_path={tiny_reference / 'checkpoints'} is not used: this run resumes its own step 2"
    ) in r.stdout and "another model" not in r.stdout


def test_initial_load_path_of_another_model_on_a_resumed_run_is_named(tiny_reference, tmp_path):
    other = tmp_path / "other"
    r = tiny_run(other, 2, "--model.d_model", "32", steps=1)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "run"
    assert tiny_run(run, 2, steps=1).returncode == 0
    r = tiny_run(run, 2, "--checkpoint.initial_load_path", str(other / "checkpoints"), steps=2)
    assert r.returncode == 0 and "resumed from step 1" in r.stdout, r.stdout + r.stderr
    assert "is not used: this run resumes its own step 1" in r.stdout
    assert "note: it holds another model" in r.stdout and "'d_model': 32" in r.stdout


def test_a_damaged_initial_load_path_is_a_bad_input_not_another_model(tiny_reference, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(step_dir(tiny_reference / "checkpoints", TINY_STEPS), src)
    shard = sorted(src.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    r = tiny_run(tmp_path / "run", 2, "--checkpoint.initial_load_path", str(src), steps=1)
    assert r.returncode == 2, r.stdout + r.stderr  # exit 3 means "a checkpoint of another model"
    assert f"checkpoint.initial_load_path {src} is damaged: file {shard} fails its checksum" in r.stderr

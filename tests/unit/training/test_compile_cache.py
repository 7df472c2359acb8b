"""The compile cache's key and places (training.model.compile_cache): every input of the compiled code changes the
key, and another key finds nothing (a changed setting or code compiles afresh, never loads a stale artefact)."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest
import torch

from training.config import ModelConfig, ParallelConfig, load_config
from training.model.compile_cache import (
    FILLED,
    ArtifactStore,
    CompileCache,
    NoCompileCache,
    cache_key,
    key_for,
    model_code_files,
)

BASE = dict(
    model=asdict(ModelConfig()),
    parallel=asdict(ParallelConfig()),
    device="cpu",
    torch_version="2.13.0+cpu",
    code={"t5.py": b"class T5: ...", "modeling_t5.py": b"def forward(): ..."},
)


def _with(**changes) -> dict:
    return {**BASE, **changes}


@pytest.mark.parametrize(
    "change",
    [
        {"model": {**BASE["model"], "d_model": 512}},
        {"model": {**BASE["model"], "attention": "eager"}},
        {"parallel": {**BASE["parallel"], "precision": "bf16"}},
        {"parallel": {**BASE["parallel"], "activation_checkpointing": True}},
        {"device": "NVIDIA H200"},
        {"torch_version": "2.14.0+cpu"},
        {"code": {**BASE["code"], "t5.py": b"class T5: pass"}},
        {"code": {**BASE["code"], "attention.py": b"new module"}},
    ],
    ids=["model-shape", "model-attention", "precision", "checkpointing", "device", "torch", "code-edit", "code-new"],
)
def test_every_input_of_the_compiled_code_changes_the_key(change):
    assert cache_key(**_with(**change)) != cache_key(**BASE)


def test_the_key_is_stable_and_ignores_where_the_cache_is_kept():
    assert cache_key(**BASE) == cache_key(**_with(code=dict(reversed(BASE["code"].items()))))
    moved = {**BASE["parallel"], "compile_cache_dir": "/fsx/elsewhere"}
    assert cache_key(**_with(parallel=moved)) == cache_key(**BASE)


def test_the_jobs_key_hashes_this_packages_model_code_and_transformers_t5():
    names = {p.name for p in model_code_files()}
    assert {"t5.py", "compile.py", "compile_cache.py", "modeling_t5.py"} <= names
    cfg = load_config(["--job.out_dir", "/tmp/x"])
    key = key_for(cfg.model, cfg.parallel, torch.device("cpu"))
    assert key == key_for(cfg.model, cfg.parallel, torch.device("cpu"))
    cfg.model.num_layers += 1
    assert key_for(cfg.model, cfg.parallel, torch.device("cpu")) != key


def test_a_changed_key_misses_what_another_key_stored(tmp_path):
    a, b = cache_key(**BASE), cache_key(**_with(torch_version="2.14.0"))
    assert ArtifactStore(tmp_path, a).write(b"artefacts of a")
    assert not ArtifactStore(tmp_path, a).write(b"again")  # written once per key
    assert ArtifactStore(tmp_path, a).read() == b"artefacts of a"
    assert ArtifactStore(tmp_path, b).read() is None
    assert [p.name for p in tmp_path.iterdir()] == [f"{a}.bin"]  # no temporary file left


def test_a_start_points_inductor_at_its_keys_directory_and_a_filled_one_is_a_local_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/not/this")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/not/this")
    key = cache_key(**BASE)
    cache = CompileCache(key, tmp_path / "shared", tmp_path / "local", rank=0, local_rank=0)
    assert cache.open() == {"key": key, "local_hit": False, "loaded": None}
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "local" / key / "inductor")
    cache.after_first_step()  # nothing compiled in this process: nothing to publish, the directory is marked
    assert (tmp_path / "local" / key / FILLED).exists()
    again = CompileCache(key, tmp_path / "shared", tmp_path / "local", rank=0, local_rank=0)
    assert again.open()["local_hit"] is True
    other = cache_key(**_with(device="NVIDIA H200"))
    assert (
        CompileCache(other, tmp_path / "shared", tmp_path / "local", rank=0, local_rank=0).open()["local_hit"] is False
    )


def test_compiling_off_or_the_cache_off_keeps_nothing(tmp_path):
    cfg = load_config(["--job.out_dir", str(tmp_path), "--parallel.compile", "on"])
    assert cfg.parallel.compile_cache_dir == str(tmp_path / "compile-cache")
    on = CompileCache.build(cfg.parallel, cfg.model, torch.device("cpu"), rank=0, local_rank=0, enabled=True)
    assert isinstance(on, CompileCache) and on.store.path.parent == tmp_path / "compile-cache"
    off = CompileCache.build(cfg.parallel, cfg.model, torch.device("cpu"), rank=0, local_rank=0, enabled=False)
    assert isinstance(off, NoCompileCache) and off.open() is None
    cfg = load_config(["--job.out_dir", str(tmp_path), "--parallel.compile_cache_dir", "off"])
    assert isinstance(
        CompileCache.build(cfg.parallel, cfg.model, torch.device("cpu"), rank=0, local_rank=0, enabled=True),
        NoCompileCache,
    )

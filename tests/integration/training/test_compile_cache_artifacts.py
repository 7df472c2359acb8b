"""training.model.compile_cache on a tiny compiled function (seconds, not a model's minutes): rank 0 publishes the
portable artefacts after the first compiled step, a node whose own cache was never filled loads them, a filled
node uses its own."""

from __future__ import annotations

import torch
import torch._inductor.config

from training.model.compile_cache import CompileCache


def _first_step(cache: CompileCache) -> dict:
    record = cache.open()
    torch._dynamo.reset()  # a compile of this process's earlier test must not stand in for this node's

    @torch.compile(backend="inductor")
    def step(x):
        return torch.sin(x) * 2 + 1

    step(torch.ones(8))
    cache.after_first_step()
    return record


def test_published_artefacts_are_loaded_by_a_node_that_never_compiled(tmp_path, monkeypatch):
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # open() points them at the key's directory
        monkeypatch.delenv(var, raising=False)
    # compile in this process: a pool of compile workers (each importing torch) costs more than this kernel. The
    # config module's own patch, not monkeypatch: its undo deletes the attribute the module computed at import
    # (compile_threads not in vars()), and every later compile of this process then fails (AttributeError)
    with torch._inductor.config.patch(compile_threads=1):
        _published_then_loaded(tmp_path)


def _published_then_loaded(tmp_path) -> None:
    shared = tmp_path / "shared"
    node_a = CompileCache("k1", shared, tmp_path / "node-a", rank=0, local_rank=0)
    assert _first_step(node_a) == {"key": "k1", "local_hit": False, "loaded": None}
    assert (shared / "k1.bin").stat().st_size > 0
    node_b = CompileCache("k1", shared, tmp_path / "node-b", rank=1, local_rank=0)
    assert _first_step(node_b) == {"key": "k1", "local_hit": False, "loaded": "shared"}
    again = CompileCache("k1", shared, tmp_path / "node-a", rank=0, local_rank=0)
    assert again.open() == {"key": "k1", "local_hit": True, "loaded": None}
    other_key = CompileCache("k2", shared, tmp_path / "node-c", rank=1, local_rank=0)
    assert other_key.open() == {"key": "k2", "local_hit": False, "loaded": None}

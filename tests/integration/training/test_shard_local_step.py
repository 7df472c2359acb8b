"""The optimizer step and the gradient clip on the local shards (training.job.optimizer.ShardLocalAdamW,
training.job.grad_clip.clip_grad_norm) against torch's own on DTensors, on real torch: two processes, a gloo group,
an FSDP2 model built twice from one seed, the same inputs.

* the step is torch's AdamW bit for bit (each implementation), and its state has torch's layout (types, DTensor
  placements, dtypes, devices), so checkpoints and DCP see no difference;
* the clip gives torch's norm and scales the gradients as torch does (up to the rounding of the norm: the sum of
  the ranks' squares is added in another order);
* neither propagates any op's sharding, where torch's did on a new mesh (what a replacement, a new process, paid in
  its first step: docs/inprocess.md)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.integration.training.test_inplace_mesh_names import _propagations

pytestmark = pytest.mark.integration
IMPLS = ("fused", "foreach", "for_loop")
FLAGS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False)}


def _model(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 7))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _layout(state: dict) -> list:
    return [
        [k, type(v).__name__, str(v.dtype), str(v.device), str(getattr(v, "placements", ""))]
        for entry in state["state"].values()
        for k, v in sorted(entry.items())
    ]


def _counted(out: dict, whose: str, fn):
    """``fn()``, its sharding propagations added to ``out``."""
    got = []
    out["propagations"][whose] += _propagations(lambda: got.append(fn()))
    return got[0]


def _compare(impl: str, mesh, rank: int) -> dict:
    from training.job.grad_clip import clip_grad_norm
    from training.job.optimizer import build_adamw

    ours, theirs = _model(mesh), _model(mesh)
    opt_ours = build_adamw(ours.parameters(), lr=1e-2, weight_decay=0.1, impl=impl)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), **FLAGS[impl])
    out = {"norms": [], "grad_diff": 0.0, "propagations": {"ours": 0, "theirs": 0}}
    for step in range(3):
        torch.manual_seed(100 + 10 * step + rank)
        x = torch.randn(5, 16)
        for model in (ours, theirs):
            model(x).pow(2).sum().backward()
        norms = {
            "ours": _counted(out, "ours", lambda: clip_grad_norm(ours.parameters(), 0.5)),
            "theirs": _counted(out, "theirs", lambda: torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)),
        }
        out["norms"].append([norms["ours"].item(), norms["theirs"].full_tensor().item()])
        for a, b in zip(ours.parameters(), theirs.parameters()):
            ga, gb = a.grad.to_local(), b.grad.to_local()
            out["grad_diff"] = max(out["grad_diff"], ((ga - gb).abs() / gb.abs().clamp_min(1e-12)).max().item())
            gb.copy_(ga)  # the steps compared on the same gradients
        _counted(out, "ours", opt_ours.step)
        _counted(out, "theirs", opt_theirs.step)
        opt_ours.zero_grad()
        opt_theirs.zero_grad()
    out["params_equal"] = all(
        torch.equal(a.to_local(), b.to_local()) for a, b in zip(ours.parameters(), theirs.parameters())
    )
    out["layout"] = [_layout(opt_ours.state_dict()), _layout(opt_theirs.state_dict())]
    return out


def _rank(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=2)
    results = {impl: _compare(impl, init_device_mesh("cpu", (2,)), rank) for impl in IMPLS}
    with open(f"{root}/rank{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("shard_local_step")
    mp.start_processes(_rank, args=(str(root),), nprocs=2, start_method="spawn")
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_step_on_local_shards_is_torchs_adamw_bit_for_bit_with_its_state_layout(results, impl):
    for rank in results:
        r = rank[impl]
        assert r["params_equal"]
        ours, theirs = r["layout"]
        assert ours == theirs and any("Shard(dim=0)" in entry[4] for entry in ours)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_clip_on_local_shards_gives_torchs_norm(results, impl):
    for rank in results:
        for ours, theirs in rank[impl]["norms"]:
            assert ours == pytest.approx(theirs, rel=1e-6) and ours > 0.5  # clipped: the scaling was exercised
        assert rank[impl]["grad_diff"] < 1e-6  # each gradient scaled as torch scales it (up to rounding)


def test_neither_propagates_any_sharding_where_torchs_did(results):
    for rank in results:
        for impl in IMPLS:
            counts = rank[impl]["propagations"]
            assert counts["ours"] == 0 and counts["theirs"] > 0, (impl, counts)

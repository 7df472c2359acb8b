"""The async-save stager: an exact private copy, in buffers reused by every later save."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from training.checkpoint.staging import ReusedBufferStager


@pytest.fixture(scope="module")
def mesh():
    """A one-process gloo group, so DTensors (what FSDP2 state dicts hold) can be built in-process."""
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _state(mesh):
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": distribute_tensor(torch.randn(6, 4, generator=g), mesh, [Shard(0)]),
            "b": torch.randn(4, generator=g),
        },
        "optim": {
            "state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.randn(6, 4, generator=g)}},
            "param_groups": [{"lr": 1e-3, "params": ["w"]}],
        },
        "progress": {"step": 7, "tokens_seen": 1234},
    }


def test_staged_copy_is_exact_and_independent_of_later_training(mesh):
    state = _state(mesh)
    stager = ReusedBufferStager()
    staged = stager.stage(state)
    assert isinstance(staged["model"]["w"], DTensor)
    assert staged["model"]["w"].placements == state["model"]["w"].placements
    assert staged["model"]["w"].shape == state["model"]["w"].shape
    before = staged["model"]["w"].to_local().clone()
    assert torch.equal(before, state["model"]["w"].to_local())
    assert torch.equal(staged["optim"]["state"]["w"]["exp_avg"], state["optim"]["state"]["w"]["exp_avg"])
    assert staged["progress"] == {"step": 7, "tokens_seen": 1234}

    # Training goes on: in-place updates and a mutated param group must not reach the staged copy.
    state["model"]["w"].to_local().add_(1.0)
    state["optim"]["state"]["w"]["step"].add_(1)
    state["optim"]["param_groups"][0]["lr"] = 5.0
    assert torch.equal(staged["model"]["w"].to_local(), before)
    assert staged["optim"]["state"]["w"]["step"].item() == 3.0
    assert staged["optim"]["param_groups"][0]["lr"] == 1e-3


def test_buffers_are_reused_across_saves_and_hold_the_newest_state(mesh):
    state = _state(mesh)
    stager = ReusedBufferStager()
    first = stager.stage(state)
    w_ptr, b_ptr = first["model"]["w"].to_local().data_ptr(), first["model"]["b"].data_ptr()
    state["model"]["b"].mul_(2)
    second = stager.stage(state)
    assert (second["model"]["w"].to_local().data_ptr(), second["model"]["b"].data_ptr()) == (w_ptr, b_ptr)
    assert torch.equal(second["model"]["b"], state["model"]["b"])
    stager.close()
    assert not stager._buffers


def _local_leaves(x):
    """Every staged tensor, with a DTensor's local shard standing for it."""
    if isinstance(x, DTensor):
        yield x._local_tensor
    elif isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _local_leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _local_leaves(v)


def test_a_staged_dtensor_wraps_the_host_buffer_itself(mesh, monkeypatch):
    # On CUDA, DTensor.from_local moves its input to the mesh's device: each save would copy the shard back
    # onto the GPU. On this CPU machine nothing would move, so the code path is checked instead: the staged
    # DTensor holds the stager's own host buffer (no copy, no view) and from_local is never called.
    def moves_to_mesh_device(*args, **kwargs):
        raise AssertionError("DTensor.from_local moves the staged shard to the mesh's device")

    monkeypatch.setattr(DTensor, "from_local", moves_to_mesh_device)
    state = _state(mesh)
    stager = ReusedBufferStager()
    staged = stager.stage(state)
    w = staged["model"]["w"]
    assert w._local_tensor is stager._buffers["/model/w"]
    assert (w.shape, w.stride(), w.placements, w.device_mesh) == (
        state["model"]["w"].shape,
        state["model"]["w"].stride(),
        state["model"]["w"].placements,
        mesh,
    )
    assert all(t.device.type == "cpu" for t in _local_leaves(staged))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_state_on_a_gpu_is_staged_entirely_in_pinned_host_memory(mesh):
    gpu_mesh = init_device_mesh("cuda", (1,))
    g = torch.Generator().manual_seed(0)
    state = {
        "model": {
            "w": distribute_tensor(torch.randn(6, 4, generator=g).cuda(), gpu_mesh, [Shard(0)]),
            "b": torch.randn(4, generator=g).cuda(),
        },
        "step": 3,
    }
    before = torch.cuda.memory_allocated()
    stager = ReusedBufferStager()
    staged = stager.stage(state)
    leaves = list(_local_leaves(staged))
    assert [t.device.type for t in leaves] == ["cpu", "cpu"]
    assert all(t.is_pinned() for t in leaves)
    assert torch.cuda.memory_allocated() == before  # staging allocated nothing on the GPU
    assert torch.equal(staged["model"]["w"]._local_tensor, state["model"]["w"].to_local().cpu())


def _ptrs(staged) -> list[int]:
    out = []
    for x in (staged["model"]["w"].to_local(), staged["model"]["b"], staged["optim"]["state"]["w"]["exp_avg"]):
        out.append(x.data_ptr())
    return out


def test_allocate_makes_the_buffers_and_the_first_save_makes_none(mesh):
    state = _state(mesh)
    stager = ReusedBufferStager()
    stager.allocate(state)
    made = stager.allocations
    assert made == 4 and stager.nbytes == 4 * (24 + 4 + 1 + 24)  # w, b, step, exp_avg (float32)
    staged = stager.stage(state)
    assert stager.allocations == made  # the save copies into what allocate made
    assert torch.equal(staged["model"]["b"], state["model"]["b"])


def test_a_stager_handed_over_keeps_the_buffers_and_the_old_ones_close_frees_none_of_them(mesh):
    state = _state(mesh)
    old = ReusedBufferStager()
    before = _ptrs(old.stage(state))
    new = old.hand_over()
    assert old.nbytes == 0 and new.nbytes > 0
    old.close()  # the old storage tier's release, after an in-place recovery
    staged = new.stage(state)
    assert _ptrs(staged) == before and new.allocations == 0  # the same memory, nothing allocated anew
    assert torch.equal(staged["optim"]["state"]["w"]["exp_avg"], state["optim"]["state"]["w"]["exp_avg"])
    grown = {**state, "model": {**state["model"], "b": torch.ones(8)}}  # a world-size change: another shape
    new.stage(grown)
    assert new.allocations == 1  # only what no longer fits is made anew

"""training.checkpoint.local_shards: a snapshot of this rank's own shards copied straight into a fresh model and
optimizer gives exactly what DCP's set_state_dict gives (weights, moments, step counts with their device and
dtype, the scheduled lr) and trains on bitwise the same, on every AdamW implementation; a snapshot that does not
fit is refused with its reason before anything is copied."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from training.checkpoint.state import Progress, TrainState
from training.job.optimizer import IMPLS, build_adamw


def build(seed: int, impl: str, width: int = 6, out: int = 3) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, out))
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = build_adamw(model.parameters(), lr=0.01, weight_decay=0.1, impl=impl)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    return TrainState(model, optimizer, scheduler, Progress())


def train(state: TrainState, steps: int) -> None:
    for _ in range(steps):
        state.model(torch.randn(2, 4)).sum().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.scheduler.step()
        state.progress.step += 1


def local_copy(obj):
    """The state dict as a memory snapshot holds it: every tensor a plain copy of this rank's local shard."""
    if isinstance(obj, torch.Tensor):
        return (obj.to_local() if isinstance(obj, DTensor) else obj).clone()
    if isinstance(obj, dict):
        return {k: local_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_copy(v) for v in obj)
    return obj


def flat(sd, prefix=""):
    """(path, value) pairs of a nested state dict, tensors as (local values, dtype, device)."""
    if isinstance(sd, dict):
        return [x for k, v in sorted(sd.items(), key=str) for x in flat(v, f"{prefix}/{k}")]
    if isinstance(sd, (list, tuple)):
        return [x for i, v in enumerate(sd) for x in flat(v, f"{prefix}/{i}")]
    if isinstance(sd, torch.Tensor):
        t = sd.to_local() if isinstance(sd, DTensor) else sd
        return [(prefix, (t.tolist(), t.dtype, t.device.type))]
    return [(prefix, sd)]


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize("impl", IMPLS)
def test_copied_in_equals_set_state_dict_and_trains_on_bitwise(impl):
    saved = build(seed=0, impl=impl)
    train(saved, 3)
    sd = saved.state_dict()
    fast, general = build(seed=1, impl=impl), build(seed=2, impl=impl)  # other weights, no optimizer state yet
    assert not fast.optimizer.state and not general.optimizer.state

    assert fast.load_local_shards(local_copy(sd)) == ""
    general.load_state_dict(sd)

    assert flat(fast.state_dict()) == flat(general.state_dict()) == flat(sd)
    assert fast.progress.step == 3 and fast.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"]
    rng = torch.get_rng_state()
    train(general, 2)
    torch.set_rng_state(rng)
    train(fast, 2)
    for a, b in zip(general.model.parameters(), fast.model.parameters()):
        assert torch.equal(a.to_local(), b.to_local())


@pytest.mark.usefixtures("world_of_one")
def test_a_snapshot_that_does_not_fit_is_refused_with_its_reason_and_nothing_is_copied():
    other = build(seed=0, impl="fused", width=7)
    train(other, 1)
    target = build(seed=1, impl="fused")
    before = [p.to_local().clone() for p in target.model.parameters()]

    why = target.load_local_shards(local_copy(other.state_dict()))

    assert "0.weight" in why and "(7, 4)" in why and "(6, 4)" in why
    assert all(torch.equal(a, p.to_local()) for a, p in zip(before, target.model.parameters()))
    assert not target.optimizer.state and target.progress.step == 0


@pytest.mark.usefixtures("world_of_one")
def test_optimizer_entries_that_name_other_parameters_are_refused():
    """Two parameters of one shape swapped in the snapshot's optimizer group (0.weight and 2.weight, both 4 x 4):
    counts and shapes fit, the names do not (each must be the model's parameter of that name): refused, nothing
    copied, rather than each one's moments given to the other."""
    saved = build(seed=0, impl="fused", width=4, out=4)
    train(saved, 1)
    sd = local_copy(saved.state_dict())
    names = sd["optim"]["param_groups"][0]["params"]
    i, j = names.index("0.weight"), names.index("2.weight")
    names[i], names[j] = names[j], names[i]
    target = build(seed=1, impl="fused", width=4, out=4)

    why = target.load_local_shards(sd)

    assert why == "the snapshot's optimizer entry 2.weight is not this optimizer's parameter of that name"
    assert not target.optimizer.state and target.progress.step == 0

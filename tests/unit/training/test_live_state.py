"""training.job.live_state: a survivor's kept state, copied into a model and optimizer built again on a new mesh,
is bitwise what it held; a collective that failed mid-forward (FSDP2's unsharded parameters still registered) is
resharded before the capture, not kept as full tensors."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from training.checkpoint.state import Progress, RngState
from training.job.live_state import LiveState


def build(name: str, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=(name,))  # a name per epoch, as the trainer does
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, progress=Progress())


def train(objs, steps: int) -> None:
    for _ in range(steps):
        objs["model"](torch.randn(2, 4)).sum().backward()
        objs["optimizer"].step()
        objs["optimizer"].zero_grad()
        objs["scheduler"].step()
        objs["progress"].step += 1


@pytest.mark.usefixtures("world_of_one")
def test_the_kept_state_trains_on_bitwise_like_the_survivor_and_a_failed_forward_is_resharded_first():
    old = build("epoch1", seed=0)
    train(old, 3)
    rng = {"cpu": torch.get_rng_state()}

    class Lost(Exception):
        pass

    def fail(*_):
        raise Lost  # as a collective that lost its peer inside the forward, after the root's unshard

    hook = old["model"][2].register_forward_hook(fail)
    with pytest.raises(Lost):
        old["model"](torch.randn(2, 4))
    hook.remove()
    assert not all(isinstance(p, DTensor) for p in old["model"].parameters())  # the unsharded ones registered
    live = LiveState.capture(step=3, rng=rng, **old)
    assert live is not None and all(isinstance(p, DTensor) for p in old["model"].parameters())

    new = build("epoch2", seed=1)  # other weights: the copy must replace them
    rng_state = RngState(torch.device("cpu"))
    assert live.install(rng_state=rng_state, **new) == ""
    assert new["progress"].step == 3 and rng_state.apply_loaded()
    torch.set_rng_state(rng["cpu"])
    train(old, 2)
    torch.set_rng_state(rng["cpu"])
    train(new, 2)
    for a, b in zip(old["model"].parameters(), new["model"].parameters()):
        assert torch.equal(a.to_local(), b.to_local())
    assert new["optimizer"].param_groups[0]["lr"] == old["optimizer"].param_groups[0]["lr"]

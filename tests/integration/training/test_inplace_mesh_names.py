"""Why an in-place job names its device mesh by the group's epoch (training.job.failover.InPlace.mesh_dims), on real
torch: two processes, a gloo group formed, dropped and formed again as in an in-place recovery, an FSDP2 model built
on each group's mesh. A DeviceMesh equal to one built before (same shape, ranks and names) is what DTensor's sharding
propagation cache hands back, with the coordinate the process had then:

* the same name across a rank change (a survivor shrunk to a smaller world, then grown back into another rank): the
  re-formed group's parameters hold the old rank's coordinate;
* the epoch in the name (the project's): the coordinate is right, and the price is the cache: a survivor's first step
  on the new group propagates every op again (~0.6 s of the debug preset's first step here). A name holding the
  rank instead keeps both right (measured 2026-11-30: coordinate right, no propagation in the next epoch at the same
  rank), but gained nothing end to end: the replacement's own first step, a new process's, gates the survivors'
  (docs/inprocess.md)."""

from __future__ import annotations

import cProfile
import pstats

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.integration


def _propagations(fn) -> int:
    """How many times DTensor propagated an op's sharding (cache misses) while ``fn`` ran: a profile of torch's
    private ``propagate_op_sharding_non_cached`` (renamed in a later torch, the count is 0 and the assertion that a
    new process propagates fails, saying so)."""
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    return sum(v[0] for k, v in pstats.Stats(profile).stats.items() if k[2] == "propagate_op_sharding_non_cached")


def _epoch(root: str, epoch: int, rank: int, name: str | None):
    """Form epoch ``epoch``'s group with this process at ``rank``, build the model on a mesh named ``name``, run
    one step; return (the parameters' mesh coordinate, the sharding propagations of the step)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{root}/epoch{epoch}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(name,) if name else None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        model(torch.ones(2, 8)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    propagated = _propagations(step)
    coordinate = next(model.parameters()).device_mesh.get_coordinate()
    dist.destroy_process_group()
    return coordinate, propagated


def _epoch_name(epoch: int, rank: int) -> str:
    """The project's name for this epoch's mesh dimension (``rank``: unused, as the project does)."""
    from training.job.failover import InPlace
    from training.job.inplace.agreement import Membership

    policy = InPlace(group=None, first_world=2, join_bound_s=5.0)
    policy.membership = Membership(epoch, ("m0", "m1"), step=0, store="h:1")  # the name depends on the epoch only
    (name,) = policy.mesh_dims()
    return name


NAMINGS = {"same": lambda epoch, rank: "fsdp", "project": _epoch_name}


def _process(start_rank: int, root: str, out: dict) -> None:
    """Each naming in turn, in one process (its DTensor cache is per process: the "same" epochs' meshes, named
    ``fsdp``, never equal the project's)."""
    torch.set_num_threads(1)
    for naming, name_of in NAMINGS.items():
        results = []
        # epoch 1 at the start rank; epoch 2 the ranks swapped; epoch 3 each at its epoch 2 rank again
        for epoch, rank in ((1, start_rank), (2, 1 - start_rank), (3, 1 - start_rank)):
            results.append((rank, *_epoch(f"{root}/{naming}", epoch, rank, name_of(epoch, rank))))
        out[(naming, start_rank)] = results


def test_a_mesh_named_per_epoch_keeps_the_coordinate_right_where_one_name_for_all_would_not(tmp_path):
    for naming in NAMINGS:
        (tmp_path / naming).mkdir()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_process, args=(str(tmp_path), out), nprocs=2, start_method="spawn", join=True)
        results = dict(out)
    for start_rank in (0, 1):
        (r1, c1, p1), (r2, c2, _), _ = results[("same", start_rank)]
        assert c1 == (r1,) and p1 > 0  # a new process propagates every op once
        assert c2 == (r1,) != (r2,)  # the equal mesh from epoch 1: the old rank's coordinate (wrong)
        (r1, c1, _), (r2, c2, _), (r3, c3, p3) = results[("project", start_rank)]
        assert (c1, c2, c3) == ((r1,), (r2,), (r3,))  # always this process's rank
        assert p3 > 0  # its price: epoch 3, at epoch 2's rank, propagates again (a new mesh)

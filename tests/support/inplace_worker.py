"""A rank for the in-process recovery test (tests/integration/failover/test_inplace_recovery.py): forms or joins
the job's group through :class:`training.job.inplace.group.InPlaceGroup` on the job's etcd (``T5_ETCD_*``), then
all-reduces ``step + 1`` every step into an accumulator, checking each result against the world size, until the
step the test writes into ``STOP`` (every rank stops at that same step).

After every formation all ranks take rank 0's accumulator and step (a broadcast): a joiner has none, and rank 0 is a
survivor (old members keep the lowest ranks). It writes one JSON line per event to ``<dir>/<member>.jsonl``:
``formed`` (epoch, world, rank, step, pid), ``step`` (step, world), ``recovered`` (when its collective raised, when
its first collective after the recovery completed, the parts' seconds) and ``done`` (final accumulator, the world
size of every step it ran, pid).

    python -m tests.support.inplace_worker --member w0 --dir D --first-world 3
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--member", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--first-world", type=int, default=1)
    p.add_argument("--gather-s", type=float, default=1.0)
    p.add_argument("--bound-s", type=float, default=10.0)
    p.add_argument("--step-sleep", type=float, default=0.02)
    a = p.parse_args()

    import torch
    import torch.distributed as dist

    from training.job.inplace.agreement import AgreementSettings, InPlaceFailed
    from training.job.inplace.group import GroupSettings, InPlaceGroup
    from training.launch.inplace_board import EtcdBoard
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient

    torch.set_num_threads(1)
    out = open(os.path.join(a.dir, f"{a.member}.jsonl"), "a", buffering=1)

    def emit(event: str, **fields) -> None:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    stop_file = os.path.join(a.dir, "STOP")
    agreement = AgreementSettings(gather_s=a.gather_s, bound_s=a.bound_s)
    group = InPlaceGroup(
        EtcdBoard(EtcdClient(ClientCredentials.from_env())),
        a.member,
        GroupSettings(agreement=agreement, pg_timeout_s=10.0),
    )
    acc = torch.zeros(1, dtype=torch.float64)
    prev = acc.clone()
    step, worlds = 0, {}

    def take_rank0_state() -> None:
        nonlocal acc, step
        state = torch.tensor([acc.item(), float(step)], dtype=torch.float64)
        dist.broadcast(state, 0)
        acc, step = state[:1].clone(), int(state[1].item())

    def formed(m) -> None:
        take_rank0_state()
        emit("formed", epoch=m.epoch, world=m.world_size, rank=m.rank(a.member), step=step, pid=os.getpid())

    formed(group.form(first_world=a.first_world))
    stop_at, recovery = None, None
    while stop_at is None or step < stop_at:
        if stop_at is None and os.path.exists(stop_file):
            with open(stop_file) as f:
                stop_at = int(f.read())
        failed_at = None
        try:
            if group.joiner_waiting():
                formed(group.recover(step))
                continue  # every member, the joiner too, starts its loop with joiner_waiting()'s collective
            world = dist.get_world_size()
            contribution = torch.tensor([float(step + 1)], dtype=torch.float64)
            dist.all_reduce(contribution)
            if contribution.item() != world * (step + 1):
                raise SystemExit(f"step {step}: all_reduce gave {contribution.item()}, not {world * (step + 1)}")
            prev, acc, step = acc.clone(), acc + contribution, step + 1
            worlds[step - 1] = world
            if recovery is not None:  # the first collective of a training step since the failure
                emit("recovered", next_collective_at=time.time(), **recovery)
                recovery = None
            emit("step", step=step, world=world)
            time.sleep(a.step_sleep)
        except InPlaceFailed:
            raise  # the job falls back to a full restart (it said why)
        except RuntimeError:  # a peer lost in a collective
            failed_at = time.time()
        if failed_at is not None:  # after the except block: its traceback would keep the old group's connections
            m = group.recover(step)
            if m.step == step - 1:  # a peer did not complete the collective this rank completed: roll back
                acc, step = prev, step - 1
                worlds.pop(step, None)
            recovery = {"failed_at": failed_at, "epoch": m.epoch, "world": m.world_size, "pid": os.getpid()}
            recovery |= vars(group.timings)
            formed(m)
    emit("done", acc=acc.item(), step=step, worlds=worlds, pid=os.getpid())
    group.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

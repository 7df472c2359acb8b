"""The ranks of the in-process recovery test (tests/integration/failover/test_inplace_recovery.py), and their agent.

One process imports torch once and forks one child per member (as the launcher's warm workers do: four cold
starts of torch cost this shared 2-core machine ~10 s); it then plays the members' agent: it reaps them, and
reports a member that died of a signal gone on the job's board, as an agent's ``waitpid`` would. Each child forms
or joins the job's group through :class:`training.job.inplace.group.InPlaceGroup` on the job's etcd (``T5_ETCD_*``),
then all-reduces ``step + 1`` every step into an accumulator, checking each result against the world size, until
the step the test writes into ``<dir>/STOP`` (every rank stops at that same step). A member named in ``--joiners``
waits for ``<dir>/GO`` before it joins, with no state.

After every formation all ranks take rank 0's accumulator and step (a broadcast): a joiner has none, and rank 0 is
a survivor (old members keep the lowest ranks). Each child writes one JSON line per event to ``<dir>/<member>.jsonl``:
``formed`` (epoch, world, rank, step, pid), ``step`` (step, world), ``recovered`` (when its collective raised, when
its next step's collective completed, the parts' seconds) and ``done`` (final accumulator, the world size of every
step it ran, pid). The agent exits 0 once every child has ended with 0 or a signal, else with the first other code.

    python -m tests.support.inplace_worker --dir D --first w0,w1,w2 --joiners w3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback


def run_member(member: str, a: argparse.Namespace, joiner: bool) -> int:
    import torch
    import torch.distributed as dist

    from training.job.failover import endpoint_ports
    from training.job.inplace.agreement import AgreementSettings, InPlaceFailed
    from training.job.inplace.group import GroupSettings, InPlaceGroup
    from training.launch.inplace_board import EtcdBoard
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient

    out = open(os.path.join(a.dir, f"{member}.jsonl"), "a", buffering=1)

    def emit(event: str, **fields) -> None:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    settings = GroupSettings(
        agreement=AgreementSettings(bound_s=a.bound_s),
        pg_timeout_s=10.0,
        keep_ports=endpoint_ports(os.environ.get("T5_ETCD_ENDPOINTS", "")),  # as training.job.failover's
    )
    group = InPlaceGroup(EtcdBoard(EtcdClient(ClientCredentials.from_env())), member, settings)
    acc = torch.zeros(1, dtype=torch.float64)
    prev = acc.clone()
    step, worlds = 0, {}

    def formed(m) -> None:
        nonlocal acc, step
        state = torch.tensor([acc.item(), float(step)], dtype=torch.float64)
        dist.broadcast(state, 0)  # rank 0's state: a joiner has none
        acc, step = state[:1].clone(), int(state[1].item())
        emit("formed", epoch=m.epoch, world=m.world_size, rank=m.rank(member), step=step, pid=os.getpid())

    while joiner and not os.path.exists(os.path.join(a.dir, "GO")):
        time.sleep(0.01)
    formed(group.form(first_world=1 if joiner else len(a.first.split(","))))
    left_over = block_on_a_survivor(emit) if a.left_over and not joiner else None  # noqa: F841 - kept alive
    stop_file = os.path.join(a.dir, "STOP")
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
            emit("cut_left_over", connections=group.cut_left_over())  # as the trainer, its old work let go
            if m.step == step - 1:  # a peer did not complete the collective this rank completed: roll back
                acc, step = prev, step - 1
                worlds.pop(step, None)
            recovery = {"failed_at": failed_at, "epoch": m.epoch, "world": m.world_size, "pid": os.getpid()}
            recovery |= vars(group.timings)
            formed(m)
    emit("done", acc=acc.item(), step=step, worlds=worlds, pid=os.getpid())
    group.close()
    return 0


def block_on_a_survivor(emit):
    """``--left-over``: work left running on the first group, as an abandoned checkpoint save can be: a subgroup
    of ranks 0 and 1 (every first member builds it; each keeps it, so its connections stay open), on which rank 0
    starts an ``all_reduce`` in a thread that rank 1 never joins. Only a cut of the old epoch's connections ends it
    before its 300 s timeout; rank 0 writes ``left_over_ended`` (with the error) when it does."""
    import datetime
    import threading

    import torch
    import torch.distributed as dist

    sub = dist.new_group([0, 1], backend="gloo", timeout=datetime.timedelta(seconds=300))
    if dist.get_rank() == 0:

        def wait() -> None:
            try:
                dist.all_reduce(torch.ones(1), group=sub)
                emit("left_over_ended", error="")
            except (RuntimeError, ValueError) as e:  # ValueError: torch's logging wrapper (the group destroyed
                cause = e.__context__ or e  # since) raised it while handling the collective's own error
                emit("left_over_ended", error=f"{type(cause).__name__}: {cause}"[:200])

        threading.Thread(target=wait, name="left-over").start()
    return sub


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--first", required=True, help="the members of the first group, comma-separated")
    p.add_argument("--joiners", default="", help="members that join once <dir>/GO appears")
    p.add_argument("--bound-s", type=float, default=10.0)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--left-over", action="store_true", help="rank 0 blocks a thread on rank 1 (block_on_a_survivor)")
    a = p.parse_args()
    import torch  # once, before the forks

    torch.set_num_threads(1)
    import torch.distributed  # noqa: F401
    import training.job.inplace.group  # noqa: F401
    import training.launch.inplace_board  # noqa: F401
    from training.job.lifecycle import die_with_parent

    children = {}
    for member in a.first.split(",") + [j for j in a.joiners.split(",") if j]:
        pid = os.fork()
        if pid == 0:  # the member: it never returns into the agent's code
            die_with_parent(signal.SIGKILL)  # a test that kills its agent (a failure) leaves no rank behind
            code = 1
            try:
                code = run_member(member, a, joiner=member not in a.first.split(","))
            except SystemExit as e:
                print(f"{member}: {e}", file=sys.stderr)
            finally:
                if sys.exc_info()[1] is not None:  # an error on its way out: os._exit below would swallow it
                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = member

    from training.launch.inplace_board import EtcdBoard
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient

    board = EtcdBoard(EtcdClient(ClientCredentials.from_env()))
    board.gone()  # logged in before it matters
    while children:
        pid, status = os.wait()
        member = children.pop(pid)
        if os.WIFSIGNALED(status):
            board.report_gone(member)  # what an agent's waitpid sees at once
            print(f"[agent] {member} (pid {pid}) ended by signal {os.WTERMSIG(status)}: reported gone", flush=True)
        elif os.WEXITSTATUS(status) != 0:
            for other in children:
                os.kill(other, signal.SIGKILL)
            return os.WEXITSTATUS(status)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The commit fence against a real local etcd (the shared ``etcd`` fixture) and a real storage tier: the agent
notes its round for its workers, a checkpoint of the current round commits confirmed, one of a replaced round is
refused and never completed, an unreachable store commits unconfirmed, and a replaced round's checkpoint is set
aside at the next restore."""

import dataclasses
import json
import socket

import pytest
import torch
import torch.distributed as dist

from training.checkpoint import generation
from training.checkpoint.layout import MARKER, SUPERSEDED, latest_complete, read_marker, step_dir
from training.checkpoint.storage import StorageTier
from training.config import CheckpointConfig
from training.errors import StaleGroup
from training.launch.rendezvous.client import EtcdClient
from training.launch.rendezvous.fence import EtcdFence
from training.launch.rendezvous.handler import EtcdRendezvousHandler


@pytest.fixture(scope="module")
def world1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def agent(etcd, tmp_path, monkeypatch, request):
    """One agent of a one-node job (its own etcd user), with the node's agent-notes directory set."""
    notes = tmp_path / "notes"
    notes.mkdir()
    monkeypatch.setenv(generation.HEARTBEAT_DIR_ENV, str(notes))
    run_id = request.node.name.replace("_", "-")[-40:]
    creds = etcd.add_job_user(run_id)
    a = EtcdRendezvousHandler(
        run_id,
        EtcdClient(creds),
        min_nodes=1,
        max_nodes=1,
        ttl_s=3,
        last_call_s=1,
        join_timeout_s=60,
        local_addr="127.0.0.1",
    )
    a.creds = creds
    yield a
    a.shutdown()


def _tier(root, fence) -> StorageTier:
    root.mkdir(exist_ok=True)
    return StorageTier(
        CheckpointConfig(dir=str(root), async_save=False), rank=0, world_size=1, signature={}, before_commit=fence
    )


def test_the_agent_notes_each_round_it_takes_a_place_in_for_its_workers(agent):
    assert generation.read() is None  # before its first round
    first = agent.next_rendezvous()
    assert first.rank == 0
    assert generation.read() == generation.Generation(round=agent.round.n, prefix=agent.prefix)
    n = agent.round.n
    agent.next_rendezvous()  # what torchrun asks when it restarts the group: a newer round
    assert agent.round.n > n
    assert generation.read() == generation.Generation(round=agent.round.n, prefix=agent.prefix)


def test_the_current_round_commits_confirmed_and_a_replaced_one_is_refused(agent, world1, tmp_path):
    agent.next_rendezvous()
    old = generation.read()
    fence = EtcdFence(EtcdClient(agent.creds), old)
    tier = _tier(tmp_path / "ckpt", fence.commit)
    tier.save(2, {"w": torch.arange(4.0)}, force=True)
    mark = read_marker(step_dir(tier.root, 2))
    assert mark["fence"]["round"] == old.round and mark["fence"]["confirmed"] is True
    recorded = EtcdClient(agent.creds).get(old.prefix + "commits/000000000002")
    assert json.loads(recorded.value)["round"] == old.round

    agent.next_rendezvous()  # a newer round forms: the old round's group is stale from now on
    new = agent.round.n
    with pytest.raises(StaleGroup) as refused:
        tier.save(4, {"w": torch.arange(4.0)}, force=True)
    assert str(refused.value).startswith(
        f"this worker group (round {old.round}) was replaced by round {new}: the commit fence refused its "
        f"checkpoint of step 4 (not completed)"
    )
    assert not (step_dir(tier.root, 4) / MARKER).exists()
    assert latest_complete(tier.root) == step_dir(tier.root, 2)
    assert EtcdClient(agent.creds).get(old.prefix + "commits/000000000004") is None
    tier.close()


def test_an_unreachable_store_commits_unconfirmed_and_a_later_restore_sets_it_aside(agent, world1, tmp_path):
    agent.next_rendezvous()
    old = generation.read()
    current = EtcdFence(EtcdClient(agent.creds), old)
    root = tmp_path / "ckpt"
    tier = _tier(root, current.commit)
    tier.save(2, {"w": torch.arange(4.0)}, force=True)
    tier.close()

    with socket.socket() as s:  # a port nothing listens on: every member unreachable for this group
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    cut_off = EtcdFence(EtcdClient(dataclasses.replace(agent.creds, endpoints=(f"https://127.0.0.1:{dead}",))), old)
    agent.next_rendezvous()  # the spares' newer round, which restores from step 2
    EtcdFence(EtcdClient(agent.creds), generation.read()).record_restore(2)

    stale_tier = _tier(root, cut_off.commit)  # the old group, cut off from the store, trains on and commits
    stale_tier.save(6, {"w": torch.arange(4.0)}, force=True)
    stale_tier.close()
    mark = read_marker(step_dir(root, 6))
    assert mark["fence"] == {"round": old.round, "confirmed": False}
    assert latest_complete(root) == step_dir(root, 6)  # complete on disk...

    now = EtcdFence(EtcdClient(agent.creds), generation.read())
    assert now.restores() == {now.round: 2}
    moved = now.set_aside_stale(root, now.restores())
    assert moved == [str(root / SUPERSEDED / f"step_00000006.stale-round-{old.round}")]
    assert latest_complete(root) == step_dir(root, 2)  # ...but never the newest complete one
    assert (root / SUPERSEDED / f"step_00000006.stale-round-{old.round}" / MARKER).is_file()  # kept


def test_the_workers_the_agent_starts_build_the_etcd_fence_on_rank_0_only(agent, monkeypatch):
    """The checkpoint room cannot import etcd's client: the launch room installs the fence in the workers it starts
    (warm: run_worker, cold: python -m training.launch.worker); without that, or without a noted round, no fence."""
    from training.checkpoint import fence as checkpoint_fence
    from training.checkpoint.fence import NoFence
    from training.launch.rendezvous.fence import install

    agent.next_rendezvous()
    for var, value in agent.creds.as_env().items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(checkpoint_fence, "_factory", None)
    assert isinstance(checkpoint_fence.build(0), NoFence)  # not installed: a plain python -m training
    install()
    built = checkpoint_fence.build(0)
    assert isinstance(built, EtcdFence) and built.round == agent.round.n
    assert isinstance(checkpoint_fence.build(1), NoFence)
    built.close()


def test_a_cold_worker_runs_the_training_module_through_the_launch_entry():
    import subprocess
    import sys

    from training.launch.warm_workers import cold_entry

    args = cold_entry(["-u", "-m", "training", "--print-config"])
    assert args == ["-u", "-m", "training.launch.worker", "--print-config"]
    assert cold_entry(["-u", "script.py"]) == ["-u", "script.py"]
    via = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    plain = subprocess.run([sys.executable, "-u", "-m", "training", "--print-config"], capture_output=True, text=True)
    assert via.returncode == 0 and via.stdout == plain.stdout and "[checkpoint]" in via.stdout

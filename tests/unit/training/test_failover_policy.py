"""failover.in_place's settings and the trainer's two failover policies (training/job/failover.py), in process:
the switch is off by default and then nothing is caught; on, only a lost peer's error is recovered (any other error
would fail again at the same step, for ever); the settings that cannot work are refused naming the fix. The path
itself, with the real trainer: tests/e2e/failover/test_inplace_agent_e2e.py (through the launcher) and
tests/e2e/failover/test_inplace_trainer_e2e.py (a smaller world)."""

from __future__ import annotations

import os
import re

import pytest
import torch.distributed as dist

from training.config import ConfigError, load_config
from training.job.failover import FullRestart, InPlace, build, member_id


def test_the_switch_is_off_by_default_and_then_nothing_is_caught():
    cfg = load_config([])
    assert cfg.failover.in_place is False
    policy = build(cfg, backend="gloo")
    assert isinstance(policy, FullRestart)
    assert policy.catches == () and policy.joiner_seen() is False and policy.mesh_dims() is None
    try:
        raise RuntimeError("Connection reset by peer")
    except policy.catches:  # what the trainer's loop does: a failure is not caught, the worker ends
        pytest.fail("the full-restart policy caught a collective's failure")
    except RuntimeError:
        pass
    assert policy.first_start(lambda: "lock") == "lock"


@pytest.mark.parametrize(
    "error, lost",
    [
        (
            RuntimeError(
                "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                "[127.0.0.1]:33936: Connection reset by peer. This is typically caused by a remote worker hanging"
            ),
            True,
        ),
        (dist.DistError("Timed out waiting 10000ms for recv operation to complete"), True),
        (RuntimeError("The size of tensor a (22) must match the size of tensor b (20)"), False),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    ],
)
def test_only_a_lost_peer_is_recovered_in_place(error, lost):
    said = InPlace.peer_lost(error)
    assert bool(said) is lost
    assert "\n" not in said and len(said) <= 200


@pytest.mark.parametrize(
    "flags, needle",
    [
        (
            ["--failover.in_place", "true", "--checkpoint.memory_interval", "0"],
            "failover.in_place needs the in-memory snapshots it restores from: set checkpoint.memory_interval to 1",
        ),
        (["--failover.in_place_min_world", "-1"], "failover.in_place_min_world=-1 must be >= 0"),
        (["--failover.in_place_bound_s", "0.5"], "failover.in_place_bound_s=0.5 must be above 1 s"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_fix(flags, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(flags)


def test_in_place_without_the_agents_board_or_etcd_is_one_line_naming_the_fix(monkeypatch):
    from training.job.inplace import agreement
    from training.launch import inplace_board

    cfg = load_config(["--failover.in_place", "true", "--checkpoint.memory_interval", "1"])
    monkeypatch.setattr(agreement, "board_factory", None)  # a plain `python -m training`: no agent installed it
    with pytest.raises(ConfigError, match=r"needs the job's etcd board, .* start the job with python -m training"):
        build(cfg, backend="gloo")
    inplace_board.install()  # what this project's agent does in its workers
    for var in [v for v in os.environ if v.startswith("T5_ETCD_")]:
        monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=r"failover.in_place needs the job's etcd: .*T5_ETCD_.* not set"):
        build(cfg, backend="gloo")


def test_a_members_id_sorts_by_its_start_rank_and_names_its_process():
    assert member_id(2, 4242).startswith("r00002-") and member_id(2, 4242).endswith("-4242")
    assert sorted([member_id(10, 1), member_id(9, 2), member_id(0, 3)]) == [
        member_id(0, 3),
        member_id(9, 2),
        member_id(10, 1),
    ]

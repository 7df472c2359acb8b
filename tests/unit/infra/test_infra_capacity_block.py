"""Capacity Blocks (issue #53 item 6): the EKS GPU node group follows the block's window, preflight saves that
window, and preflight never moves the GPU AZ under a deployed network stack (botocore's Stubber checks every request
against the real API model; AWS cannot be reached here)."""

from __future__ import annotations

import datetime
import functools
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from stacks.capacity_block import capacity_block_sizes
from stacks.config import CAPACITY_BLOCK_DRAIN, ConfigError, InfraConfig
from stacks.deploy_config import load_saved
from stacks.preflight import network_deployed, save_choice
from tests.unit.infra.test_infra_preflight import RESERVATION_ID, reservation, run

UTC = datetime.timezone.utc
START = datetime.datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
END = datetime.datetime(2026, 12, 2, 11, 30, tzinfo=UTC)
BLOCK = {"capacity_reservation_id": RESERVATION_ID, "capacity_block": True, "placement_group": False}


def test_the_node_group_is_sized_by_the_blocks_phase_at_deploy_time():
    drain = END - CAPACITY_BLOCK_DRAIN
    before = START - datetime.timedelta(days=2)
    # before the block: no node (EC2 could not launch one), scale up at its start, to 0 before its end
    assert capacity_block_sizes(2, (START, END), before) == (
        0,
        [("ScaleUpAtBlockStart", START, 2), ("ScaleToZeroBeforeBlockEnd", drain, 0)],
    )
    # a (re)deploy during the block keeps the nodes; only the drain is still to come
    assert capacity_block_sizes(2, (START, END), START + datetime.timedelta(hours=1)) == (
        2,
        [("ScaleToZeroBeforeBlockEnd", drain, 0)],
    )
    assert capacity_block_sizes(2, (START, END), drain) == (0, [])  # draining or over
    assert capacity_block_sizes(2, None, before) == (0, [])  # no window: 0, scaled by hand
    assert CAPACITY_BLOCK_DRAIN > datetime.timedelta(minutes=30)  # AWS: drain more than 30 minutes ahead


def test_the_window_is_checked_with_the_settings():
    cfg = InfraConfig(**BLOCK, capacity_block_start="2026-12-01T11:30:00Z", capacity_block_end="2026-12-02T11:30:00Z")
    assert cfg.capacity_block_window == (START, END)
    with pytest.raises(ConfigError, match=r"capacityBlockStart='2026-12-01 11:30': expected a UTC time"):
        InfraConfig(**BLOCK, capacity_block_start="2026-12-01 11:30", capacity_block_end="2026-12-02T11:30:00Z")
    with pytest.raises(ConfigError, match=r"capacityBlockEnd=.*more than 0:40:00 after capacityBlockStart"):
        InfraConfig(**BLOCK, capacity_block_start="2026-12-01T11:30:00Z", capacity_block_end="2026-12-01T12:00:00Z")
    with pytest.raises(ConfigError, match=r"capacityBlockStart=.*only a Capacity Block has a window"):
        InfraConfig(capacity_block_start="2026-12-01T11:30:00Z")


def test_preflight_saves_a_capacity_blocks_window(tmp_path):
    res = reservation(State="scheduled", StartDate=START, EndDate=END)
    report = run(InfraConfig(**BLOCK), quota=0, res=res)
    assert report.ok, report.lines()
    assert report.capacity_block_window == ("2026-12-01T11:30:00Z", "2026-12-02T11:30:00Z")
    (tmp_path / "cdk.json").write_text("{}")
    save_choice({"capacityBlock": True}, report, tmp_path)
    saved = load_saved(tmp_path)
    assert (saved["capacityBlockStart"], saved["capacityBlockEnd"]) == report.capacity_block_window
    # ParallelCluster launches its static nodes when the block starts: nothing to save for it
    pc = run(InfraConfig(**BLOCK, platform="parallelcluster"), quota=0, res=res)
    assert pc.ok and pc.capacity_block_window is None


def test_preflight_never_moves_the_gpu_az_of_a_deployed_network():
    saved_azs = ("us-east-1a", "us-east-1c")  # deployed in 1a; the reservation is in 1c
    moved = run(InfraConfig(**BLOCK, availability_zones=saved_azs), quota=0, res=reservation(), deployed=True)
    assert not moved.ok and moved.availability_zones is None and moved.capacity_block_window is None
    (fail,) = [line for ok, line in moved.results if not ok]
    assert fail.startswith("GPU AZ: the deployed network stack t5ft-network has the GPU subnet and FSx in us-east-1a")
    assert "moving to us-east-1c would re-lay them" in fail and "make destroy PLATFORM=eks first" in fail
    # not deployed yet: the AZ moves to the reservation's; deployed there already: nothing moves
    assert (
        run(InfraConfig(**BLOCK, availability_zones=saved_azs), quota=0, res=reservation()).availability_zones[0]
        == "us-east-1c"
    )
    kept = run(InfraConfig(**BLOCK, availability_zones=saved_azs[::-1]), quota=0, res=reservation(), deployed=True)
    assert kept.ok and kept.availability_zones[0] == "us-east-1c"


@functools.cache
def _cfn_client() -> Any:  # one client for the three calls: each new one costs ~0.2 s
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    return session.client("cloudformation")


def _cloudformation(response: dict[str, Any] | None, error: str | None = None) -> bool:
    cfn = _cfn_client()
    with Stubber(cfn) as stub:
        if error:
            stub.add_client_error("describe_stacks", "ValidationError", error, 400, {"StackName": "t5ft-network"})
        else:
            stub.add_response("describe_stacks", response, {"StackName": "t5ft-network"})
        return network_deployed(cfn, "t5ft-network")


def test_the_network_stack_counts_as_deployed_until_it_is_deleted():
    def stack(status: str) -> dict[str, Any]:
        when = datetime.datetime(2026, 11, 1, tzinfo=UTC)
        return {"Stacks": [{"StackName": "t5ft-network", "StackStatus": status, "CreationTime": when}]}

    assert _cloudformation(stack("UPDATE_COMPLETE")) is True
    assert _cloudformation(stack("ROLLBACK_COMPLETE")) is True
    assert _cloudformation(None, "Stack with id t5ft-network does not exist") is False

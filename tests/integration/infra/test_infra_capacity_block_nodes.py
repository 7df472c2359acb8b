"""The synthesized EKS GPU node group in a Capacity Block (issue #53 item 6): 0 nodes until the block starts, two
one-time schedules scale it up at the start and to 0 before the end, with a role that may scale this node group
only; a deploy without the block's window is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import validate_parameters

from stacks.config import ConfigError
from stacks.deploy_config import plan_deploy
from tests.support.infra import ROOT, Synthesized, resources_of_type


def _filled(value: object) -> str:
    """A schedule's Input (Fn::Join of JSON text and tokens) with each token as a sample name."""
    return "".join(p if isinstance(p, str) else "t5ft-name" for p in value["Fn::Join"][1])


def test_the_gpu_node_group_follows_the_block(eks_capacity_block: Synthesized) -> None:
    t = eks_capacity_block.templates["Eks"]
    (ng_id, gpu) = next(
        (k, r) for k, r in resources_of_type(t, "AWS::EKS::Nodegroup") if r["Properties"]["AmiType"].endswith("NVIDIA")
    )
    # deployed before the block: nothing to launch yet (a fixed size of 2 would fail the deploy)
    assert gpu["Properties"]["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}
    schedules = {
        r["Properties"]["ScheduleExpression"]: r["Properties"]
        for _, r in resources_of_type(t, "AWS::Scheduler::Schedule")
    }
    assert set(schedules) == {"at(2099-03-01T11:30:00)", "at(2099-03-03T10:50:00)"}  # start; 40 min before the end
    eks_model = botocore.session.get_session().get_service_model("eks")
    request_shape = eks_model.operation_model("UpdateNodegroupConfig").input_shape
    sizes = {}
    for when, schedule in schedules.items():
        assert schedule["ScheduleExpressionTimezone"] == "UTC" and schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert schedule["Target"]["Arn"] == {
            "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":scheduler:::aws-sdk:eks:updateNodegroupConfig"]]
        }
        request = json.loads(_filled(schedule["Target"]["Input"]))
        validate_parameters(request, request_shape)  # the request EKS's API model accepts (raises otherwise)
        sizes[when] = request["scalingConfig"]["desiredSize"]
        # the node group's own name (its Ref is "<cluster>/<name>", which EKS refuses)
        assert {"Fn::GetAtt": [ng_id, "NodegroupName"]} in schedule["Target"]["Input"]["Fn::Join"][1]
    assert sizes == {"at(2099-03-01T11:30:00)": 2, "at(2099-03-03T10:50:00)": 0}
    (policy,) = [
        r["Properties"]["PolicyDocument"]["Statement"]
        for _, r in resources_of_type(t, "AWS::IAM::Policy")
        if "CapacityBlockScaling" in json.dumps(r["Properties"]["Roles"])
    ]
    assert policy == [
        {"Action": "eks:UpdateNodegroupConfig", "Effect": "Allow", "Resource": {"Fn::GetAtt": [ng_id, "Arn"]}}
    ]


def test_an_eks_deploy_into_a_block_needs_its_window(tmp_path: Path) -> None:
    shutil.copy(ROOT / "cdk.json", tmp_path / "cdk.json")
    args = ["-c", "adminRoleArn=arn:aws:iam::123456789012:role/A", "-c", "apiAllowedCidrs=[]"]
    block = ["-c", "capacityReservationId=cr-0123456789abcdef0", "-c", "capacityBlock=true"]
    block += ["-c", "placementGroup=false", "-c", "availabilityZones=us-east-1c,us-east-1a"]
    with pytest.raises(ConfigError, match=r"^capacityBlock=true on EKS needs the block's window .*make preflight"):
        plan_deploy("eks", args + block, tmp_path)
    window = ["-c", "capacityBlockStart=2099-03-01T11:30:00Z", "-c", "capacityBlockEnd=2099-03-03T11:30:00Z"]
    assert plan_deploy("eks", args + block + window, tmp_path).config.capacity_block_window is not None
    assert plan_deploy("parallelcluster", block, tmp_path).config.capacity_block  # its static nodes wait by themselves

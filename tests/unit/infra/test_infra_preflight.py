"""make preflight: the real decision code (AZ choice, reservation and quota checks, what it saves) against botocore's
Stubber (AWS cannot be reached here; the stub also checks every request against the real API model), and the
offline run: what it would check, one error line, no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import boto3
from botocore.stub import Stubber

from stacks.config import InfraConfig
from stacks.deploy_config import load_saved, save
from tests.support.infra import ROOT
from stacks.preflight import azs_to_save, choose_az, run_checks, save_choice

REGION = "us-east-1"
REGION_AZS = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]
OFFERS = {
    "InstanceTypeOfferings": [
        {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": az}
        for az in ("us-east-1d", "us-east-1c")
    ]
}
RESERVATION_ID = "cr-0123456789abcdef0"


def clients() -> tuple[Any, Any, Stubber, Stubber]:
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name=REGION)
    ec2, quotas = session.client("ec2"), session.client("service-quotas")
    return ec2, quotas, Stubber(ec2), Stubber(quotas)


def expect_offers_and_zones(ec2: Stubber) -> None:
    ec2.add_response(
        "describe_instance_type_offerings",
        OFFERS,
        {"LocationType": "availability-zone", "Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}]},
    )
    ec2.add_response(
        "describe_availability_zones",
        {"AvailabilityZones": [{"ZoneName": az, "State": "available", "RegionName": REGION} for az in REGION_AZS]},
        {"Filters": [{"Name": "zone-type", "Values": ["availability-zone"]}]},
    )


def expect_quota(ec2: Stubber, quotas: Stubber, value: float) -> None:
    ec2.add_response(
        "describe_instance_types",
        {"InstanceTypes": [{"InstanceType": "p5.48xlarge", "VCpuInfo": {"DefaultVCpus": 192}}]},
        {"InstanceTypes": ["p5.48xlarge"]},
    )
    quotas.add_response(
        "get_service_quota",
        {"Quota": {"QuotaCode": "L-417A185B", "Value": value}},
        {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"},
    )


def reservation(**overrides: Any) -> dict[str, Any]:
    res = {
        "CapacityReservationId": RESERVATION_ID,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-east-1c",
        "State": "active",
        "AvailableInstanceCount": 2,
        "TotalInstanceCount": 2,
        "ReservationType": "capacity-block",
    }
    return {"CapacityReservations": [{**res, **overrides}]}


def run(config: InfraConfig, *, quota: float = 384, res: dict[str, Any] | None = None, deployed: bool = False) -> Any:
    ec2, quotas, ec2_stub, quota_stub = clients()
    expect_offers_and_zones(ec2_stub)
    if res is not None:
        ec2_stub.add_response("describe_capacity_reservations", res, {"CapacityReservationIds": [RESERVATION_ID]})
    expect_quota(ec2_stub, quota_stub, quota)
    with ec2_stub, quota_stub:
        report = run_checks(config, ec2=ec2, quotas=quotas, region=REGION, deployed=deployed)
    ec2_stub.assert_no_pending_responses()
    return report


def test_the_gpu_az_is_the_regions_first_that_offers_the_type() -> None:
    report = run(InfraConfig())
    assert report.ok, report.lines()
    assert report.availability_zones == ["us-east-1c", "us-east-1a"]  # 1a (the region's first) has no p5
    assert any("offered in us-east-1c, us-east-1d" in line for line in report.lines())
    assert any("quota L-417A185B" in line and "384 vCPUs" in line and "need 384" in line for line in report.lines())


def test_a_short_quota_fails_with_the_number_and_the_request_to_make() -> None:
    report = run(InfraConfig(gpu_nodes=3), quota=384)  # a hot spare: 2 nodes + 1 = 576 vCPUs
    assert not report.ok
    (fail,) = [line for ok, line in report.results if not ok]
    assert "need 576" in fail and "--quota-code L-417A185B --desired-value 576" in fail


def test_a_capacity_block_sets_the_az_and_is_checked_against_the_settings() -> None:
    cfg = InfraConfig(capacity_reservation_id=RESERVATION_ID, capacity_block=True, placement_group=False)
    report = run(cfg, quota=0, res=reservation())
    assert report.ok, report.lines()  # the quota is informational with a reservation
    assert report.availability_zones[0] == "us-east-1c"
    bad = run(
        InfraConfig(capacity_reservation_id=RESERVATION_ID, placement_group=False, gpu_nodes=3),
        res=reservation(InstanceType="p4d.24xlarge"),
    )
    (fail,) = [line for ok, line in bad.results if not ok and line.startswith("reservation")]
    assert "reserves p4d.24xlarge, not gpuInstanceType p5.48xlarge" in fail
    assert "set capacityBlock=true" in fail and "gpuNodes=3 needs 3" in fail


def test_choose_az_explains_each_case() -> None:
    assert choose_az(
        offered=["us-east-1c"], region_azs=REGION_AZS, wanted=["us-east-1a", "us-east-1b"], reservation_az=None
    ) == (
        "us-east-1c",
        "us-east-1c: the saved first AZ us-east-1a does not offer it; us-east-1c is the region's first AZ that does",
    )
    assert (
        choose_az(
            offered=["us-east-1b"], region_azs=REGION_AZS, wanted=["us-east-1b", "us-east-1a"], reservation_az=None
        )[0]
        == "us-east-1b"
    )
    assert choose_az(offered=[], region_azs=REGION_AZS, wanted=[], reservation_az=None)[0] is None
    assert azs_to_save("us-east-1c", REGION_AZS, ["us-east-1b", "us-east-1c"], 2) == ["us-east-1c", "us-east-1b"]


def test_the_chosen_az_is_saved_beside_the_other_settings(tmp_path: Path) -> None:
    shutil.copy(ROOT / "cdk.json", tmp_path / "cdk.json")
    save({"adminRoleArn": "arn:aws:iam::123456789012:role/Admin", "gpuNodes": 3}, tmp_path)
    report = run(InfraConfig())
    save_choice(load_saved(tmp_path), report, tmp_path)
    saved = load_saved(tmp_path)
    assert saved == {
        "adminRoleArn": "arn:aws:iam::123456789012:role/Admin",
        "gpuNodes": 3,
        "availabilityZones": ["us-east-1c", "us-east-1a"],
        "region": REGION,
    }
    cfg = InfraConfig.from_context({**saved, "platform": "eks"})  # what the next deploy synthesizes: valid
    assert cfg.availability_zones[0] == "us-east-1c"

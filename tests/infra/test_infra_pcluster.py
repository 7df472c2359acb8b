"""ParallelCluster: the stack's custom resource, and the config validated by the REAL aws-parallelcluster
3.16.1 schema in its own venv (.venv-pcluster)."""
from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cluster_assets.parallelcluster.config import build_cluster_config
from stacks.config import PCLUSTER_VERSION
from tests.infra.support import ROOT, Synthesized, resolve_placeholders, resources_of_type

VALIDATOR = ROOT / "cluster_assets" / "parallelcluster" / "validate.py"
#: Placeholders for the CloudFormation tokens (the schema checks ID formats and cannot parse tokens).
PLACEHOLDERS = {"SubnetId": "subnet-0123456789abcdef0", "SubnetIds": "subnet-0123456789abcdef0",
                "AdditionalSecurityGroups": "sg-0123456789abcdef0", "FileSystemId": "fs-0123456789abcdef0",
                "BucketName": "example-training-bucket"}


def sample_config(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        head_node_instance_type="m7i.2xlarge", head_node_subnet_id=PLACEHOLDERS["SubnetId"],
        compute_subnet_ids=[PLACEHOLDERS["SubnetId"]], gpu_instance_type="p5.48xlarge",
        compute_resource_name="p5-48xlarge", max_nodes=2, fsx_file_system_id=PLACEHOLDERS["FileSystemId"],
        additional_security_group_ids=[PLACEHOLDERS["AdditionalSecurityGroups"]],
        bucket_name=PLACEHOLDERS["BucketName"])
    kwargs.update(overrides)
    return build_cluster_config(**kwargs)


def schema_check(python: Path, tmp_path: Path, configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Validate configs with the real ClusterSchema; returns name -> 'OK' or the error text."""
    paths = []
    for name, cfg in configs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        paths.append(str(path))
    proc = subprocess.run([str(python), str(VALIDATOR), *paths], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        status, path, *rest = line.split(" ", 2)
        out[Path(path.rstrip(":")).stem] = "OK" if status == "OK" else " ".join(rest)
    assert set(out) == set(configs), proc.stdout + proc.stderr
    return out


def test_cluster_configs_pass_the_real_schema_and_bad_ones_fail(pcluster_python: Path, tmp_path: Path) -> None:
    good = {
        "default": sample_config(),
        "full": sample_config(region="us-east-1", ssh_key_name="my-key", min_nodes=1, tags={"team": "ml"}),
        "no_placement_group_two_subnets": sample_config(placement_group=False, compute_subnet_ids=[
            "subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]),
        "g6e_without_efa": sample_config(gpu_instance_type="g6e.48xlarge", compute_resource_name="g6e-48xlarge",
                                         efa=False),
    }
    # Negative controls: prove the schema really runs (an unknown key, a bad enum, a malformed id).
    unknown_key = copy.deepcopy(good["default"])
    unknown_key["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["GpuCount"] = 8
    bad_enum = copy.deepcopy(good["default"])
    bad_enum["Scheduling"]["SlurmQueues"][0]["CapacityType"] = "CHEAP"
    bad_id = sample_config(fsx_file_system_id="my-filesystem")
    results = schema_check(pcluster_python, tmp_path, {**good, "unknown_key": unknown_key, "bad_enum": bad_enum,
                                                       "bad_id": bad_id})
    for name in good:
        assert results[name] == "OK", f"{name}: {results[name]}"
    assert "GpuCount" in results["unknown_key"] and "Unknown field" in results["unknown_key"]
    assert "CapacityType" in results["bad_enum"]
    assert "FileSystemId" in results["bad_id"]


def test_the_stacks_own_config_passes_the_real_schema(pcluster: Synthesized, pcluster_python: Path,
                                                       tmp_path: Path) -> None:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = resolve_placeholders(cr["Properties"]["ClusterConfiguration"], PLACEHOLDERS)
    assert schema_check(pcluster_python, tmp_path, {"from_stack": cfg}) == {"from_stack": "OK"}


def test_custom_resource_through_the_pinned_provider_stack(pcluster: Synthesized) -> None:
    tpl = pcluster.templates["ParallelCluster"]
    (provider_id, provider), = resources_of_type(tpl, "AWS::CloudFormation::Stack")
    url = provider["Properties"]["TemplateURL"]["Fn::Sub"]
    assert url.endswith(f"/parallelcluster/{PCLUSTER_VERSION}/templates/custom_resource/cluster.yaml")
    (cr,) = [r for _, r in resources_of_type(tpl, "Custom::PclusterCluster")]
    props = cr["Properties"]
    assert props["ServiceToken"] == {"Fn::GetAtt": [provider_id, "Outputs.ServiceToken"]}
    assert props["ClusterName"] == "t5ft-slurm"


def test_gpu_queue_uses_placement_group_efa_one_subnet_and_fsx(pcluster: Synthesized) -> None:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    (queue,) = cfg["Scheduling"]["SlurmQueues"]
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": True}
    assert len(queue["Networking"]["SubnetIds"]) == 1
    (compute,) = queue["ComputeResources"]
    assert compute == {"Name": "p4d-24xlarge", "InstanceType": "p4d.24xlarge", "MinCount": 0, "MaxCount": 4,
                       "Efa": {"Enabled": True}}
    (fsx,) = cfg["SharedStorage"]
    assert fsx["MountDir"] == "/fsx" and fsx["StorageType"] == "FsxLustre"
    assert "Fn::ImportValue" in fsx["FsxLustreSettings"]["FileSystemId"]
    assert cfg["HeadNode"]["Imds"] == {"Secured": True}
    assert queue["Networking"]["AdditionalSecurityGroups"] == cfg["HeadNode"]["Networking"]["AdditionalSecurityGroups"]


def test_outputs_make_train_needs(pcluster: Synthesized) -> None:
    outputs = pcluster.templates["ParallelCluster"]["Outputs"]
    for name in ("ClusterName", "HeadNodeAddress", "HeadNodeSessionCommand", "EcrRepositoryUri",
                 "FsxFileSystemId", "FsxMountName", "BucketName", "SlurmPartition"):
        assert name in outputs, name
    assert outputs["HeadNodeAddress"]["Value"]["Fn::GetAtt"][1] == "headNode.privateIpAddress"


@pytest.mark.parametrize("overrides,message", [
    ({"max_nodes": 0}, "max_nodes=0"),
    ({"min_nodes": 3}, "min_nodes=3"),
    ({"compute_subnet_ids": ["subnet-a", "subnet-b"]}, "cluster placement group lives in one AZ"),
    ({"compute_subnet_ids": []}, "at least one subnet"),
    ({"additional_security_group_ids": []}, "Lustre client security group"),
])
def test_bad_config_inputs_are_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_config(**overrides)

"""ParallelCluster: the stack's custom resource, and the config validated by the REAL aws-parallelcluster
3.16.1 schema in its own venv (.venv-pcluster); the etcd members' network, secrets and IAM, the nodes' security
groups, ECR pull policy and outputs; the node and member scripts (bash -n, shellcheck, run against scratch roots,
and the members' units run for real as a three-member etcd the head node's script turns authentication on in)."""

from __future__ import annotations

from typing import Any

import pytest

from cluster_assets.parallelcluster.config import build_cluster_config
from cluster_assets.parallelcluster.node_setup import NodeSetup

#: Placeholders for the CloudFormation tokens (the schema checks ID formats and cannot parse tokens).
PLACEHOLDERS = {
    "SubnetId": "subnet-0123456789abcdef0",
    "SubnetIds": "subnet-0123456789abcdef0",
    "AdditionalSecurityGroups": "sg-0123456789abcdef0",
    "FileSystemId": "fs-0123456789abcdef0",
    "BucketName": "example-training-bucket",
    "Policy": "arn:aws:iam::123456789012:policy/parallelcluster/ecr",
    "Script": "s3://example-training-bucket/0123abcd.sh",
    "Args": "placeholder-arg",
}
REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
ENDPOINTS = "https://10.0.1.10:2379,https://10.0.2.10:2379,https://10.0.1.11:2379"
CLIENT_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:etcd-client-AbCdEf"
ROOT_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:etcd-root-AbCdEf"


def sample_node_setup(**overrides: Any) -> NodeSetup:
    kwargs: dict[str, Any] = dict(
        script_bucket="cdk-assets-example",
        pyxis_enroot_script_key="1a2b.sh",
        etcd_client_script_key="3c4d.sh",
        node_base_script_key="5e6f.sh",
        ecr_registry=REGISTRY,
        region="us-east-1",
        etcd_endpoints=ENDPOINTS,
        etcd_client_secret=CLIENT_SECRET,
        etcd_root_secret=ROOT_SECRET,
    )
    kwargs.update(overrides)
    return NodeSetup(**kwargs)


def with_node_setup(**overrides: Any) -> dict[str, Any]:
    """A config with the nodes' security groups, the ECR policy and the node scripts, as the stack renders it."""
    kwargs: dict[str, Any] = dict(
        node_setup=sample_node_setup(),
        head_node_security_group_id="sg-0aaaaaaaaaaaaaaaa",
        compute_security_group_id="sg-0bbbbbbbbbbbbbbbb",
        node_iam_policy_arns=[PLACEHOLDERS["Policy"]],
    )
    kwargs.update(overrides)
    return sample_config(**kwargs)


def sample_config(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        head_node_instance_type="m7i.2xlarge",
        head_node_subnet_id=PLACEHOLDERS["SubnetId"],
        compute_subnet_ids=[PLACEHOLDERS["SubnetId"]],
        gpu_instance_type="p5.48xlarge",
        compute_resource_name="p5-48xlarge",
        max_nodes=2,
        fsx_file_system_id=PLACEHOLDERS["FileSystemId"],
        additional_security_group_ids=[PLACEHOLDERS["AdditionalSecurityGroups"]],
        bucket_name=PLACEHOLDERS["BucketName"],
    )
    kwargs.update(overrides)
    return build_cluster_config(**kwargs)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"max_nodes": 0}, "max_nodes=0"),
        ({"min_nodes": 3}, "min_nodes=3"),
        ({"compute_subnet_ids": ["subnet-a", "subnet-b"]}, "cluster placement group lives in one AZ"),
        ({"compute_subnet_ids": []}, "at least one subnet"),
        ({"additional_security_group_ids": []}, "Lustre client security group"),
    ],
)
def test_bad_config_inputs_are_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_config(**overrides)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"head_node_security_group_id": None, "compute_security_group_id": None},
            "the members' group could not admit them",
        ),
        ({"compute_security_group_id": None}, "go together"),
        ({"node_iam_policy_arns": []}, "ECR pull policy"),
        ({"compute_security_group_id": " "}, "compute_security_group_id is empty"),
    ],
)
def test_node_setup_needs_its_security_groups_and_policy(overrides: dict[str, Any], message: str) -> None:
    with_node_setup()  # the complete set is accepted
    with pytest.raises(ValueError, match=message):
        with_node_setup(**overrides)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"etcd_client_script_key": ""}, "node_setup.etcd_client_script_key is empty"),
        ({"script_bucket": " "}, "node_setup.script_bucket is empty"),
        ({"pyxis_enroot_script_key": "/abs/x.sh"}, "S3 object key of the uploaded .sh"),
        ({"ecr_registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5ft/t5-train"}, "host part"),
        ({"region": "useast1"}, "region name"),
        ({"etcd_endpoints": "10.0.1.10:2379"}, "is not https://<IPv4>:<port>"),
        ({"etcd_endpoints": "https://10.0.1.10:2379,http://10.0.2.10:2379"}, "'http://10.0.2.10:2379' is not"),
        ({"etcd_root_secret": "etcd-root"}, "expected the secret's ARN"),
        ({"etcd_client_secret": " "}, "node_setup.etcd_client_secret is empty"),
    ],
)
def test_bad_node_setup_is_rejected_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_node_setup(**overrides)


def test_node_setup_renders_custom_actions_and_object_level_s3_reads() -> None:
    cfg = with_node_setup()
    head, (queue,) = cfg["HeadNode"], cfg["Scheduling"]["SlurmQueues"]
    base_head, pyxis_head, etcd = head["CustomActions"]["OnNodeConfigured"]["Sequence"]
    assert base_head == {"Script": "s3://cdk-assets-example/5e6f.sh", "Args": ["head", "ec2-user", "/fsx"]}
    assert pyxis_head == {"Script": "s3://cdk-assets-example/1a2b.sh", "Args": ["head", REGISTRY, "us-east-1"]}
    assert etcd == {
        "Script": "s3://cdk-assets-example/3c4d.sh",
        "Args": [ENDPOINTS, CLIENT_SECRET, ROOT_SECRET, "us-east-1", "ec2-user"],
    }
    assert queue["CustomActions"] == {
        "OnNodeStart": {
            "Sequence": [
                {"Script": "s3://cdk-assets-example/5e6f.sh", "Args": ["compute", "ec2-user", "/fsx"]},
                {"Script": "s3://cdk-assets-example/1a2b.sh", "Args": ["compute", REGISTRY, "us-east-1"]},
            ]
        }
    }
    script_reads = [a for a in head["Iam"]["S3Access"] if a["BucketName"] == "cdk-assets-example"]
    assert script_reads == [
        {"BucketName": "cdk-assets-example", "KeyName": k, "EnableWriteAccess": False}
        for k in ("5e6f.sh", "1a2b.sh", "3c4d.sh")
    ]
    assert [a for a in queue["Iam"]["S3Access"] if a["BucketName"] == "cdk-assets-example"] == [
        {"BucketName": "cdk-assets-example", "KeyName": k, "EnableWriteAccess": False} for k in ("5e6f.sh", "1a2b.sh")
    ]
    ubuntu = with_node_setup(os="ubuntu2204")  # the default user follows the OS
    assert ubuntu["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Sequence"][0]["Args"] == ["head", "ubuntu", "/fsx"]
    for iam in (head["Iam"], queue["Iam"]):
        assert iam["AdditionalIamPolicies"] == [{"Policy": PLACEHOLDERS["Policy"]}]
    assert head["Networking"]["AdditionalSecurityGroups"][-1] == "sg-0aaaaaaaaaaaaaaaa"
    assert queue["Networking"]["AdditionalSecurityGroups"][-1] == "sg-0bbbbbbbbbbbbbbbb"
    assert "CustomActions" not in sample_config()["HeadNode"]  # no node_setup, no custom actions

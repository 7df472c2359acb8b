"""InfraConfig: context parsing, validation with clear errors, and cdk.json/docs staying in sync."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from stacks.config import EC2_INSTANCE_TYPE, ConfigError, InfraConfig, defaults, field_docs
from cluster_facts import GPU_INSTANCES, gpu_instance
from tests.support.infra import ROOT


def test_defaults_are_valid_and_env_agnostic() -> None:
    cfg = InfraConfig()
    assert (cfg.platform, cfg.gpu_instance_type, cfg.kubernetes_version, cfg.trainer_chart_version) == (
        "eks",
        "p5.48xlarge",
        "1.35",
        "2.3.0",
    )
    assert cfg.account is None and cfg.region is None  # synthesizes offline
    assert cfg.gpu.efa_interfaces == 32 and cfg.gpu.gpus == 8


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        InfraConfig().gpu_nodes = 3  # type: ignore[misc]


def test_cli_strings_are_coerced_to_field_types() -> None:
    cfg = InfraConfig.from_context(
        {
            "gpuNodes": "4",
            "placementGroup": "false",
            "gpuSubnetCount": "2",
            "maxAzs": "3",
            "apiAllowedCidrs": "203.0.113.0/24, 198.51.100.7/32",
            "availabilityZones": '["us-east-1a","us-east-1b","us-east-1c"]',
            "region": "us-east-1",
            "bucketName": "",
            "fsxStorageCapacityGiB": "4800",
        }
    )
    assert cfg.gpu_nodes == 4 and cfg.placement_group is False and cfg.gpu_subnet_count == 2
    assert cfg.api_allowed_cidrs == ("203.0.113.0/24", "198.51.100.7/32")
    assert cfg.availability_zones == ("us-east-1a", "us-east-1b", "us-east-1c")
    assert cfg.bucket_name is None  # "" means unset
    assert cfg.fsx_storage_capacity_gib == 4800
    assert InfraConfig.from_context({"apiAllowedCidrs": "[]"}).api_allowed_cidrs == ()


BAD_INPUTS = [
    ({"platform": "k8s"}, r"platform='k8s'.*eks, parallelcluster"),
    ({"gpuInstanceType": "p9.96xlarge"}, r"gpuInstanceType='p9.96xlarge'.*p4d.24xlarge.*p5.48xlarge"),
    ({"gpuNodes": "0"}, r"gpuNodes=0: need at least 1"),
    ({"gpuNodes": "two"}, r"gpuNodes='two': expected an integer"),
    ({"gpuSubnetCount": "2"}, r"gpuSubnetCount=2: a CLUSTER placement group lives in one AZ.*placementGroup=false"),
    ({"gpuSubnetCount": "3", "placementGroup": "false"}, r"gpuSubnetCount=3: use 1..maxAzs \(2\)"),
    ({"placementGroup": "maybe"}, r"placementGroup='maybe': expected true or false"),
    ({"fsxStorageCapacityGiB": "3000"}, r"fsxStorageCapacityGiB=3000: .*1200 GiB or a multiple of 2400.*2400 or 4800"),
    ({"fsxStorageCapacityGiB": "600"}, r"fsxStorageCapacityGiB=600"),
    ({"fsxThroughputPerTiB": "200"}, r"fsxThroughputPerTiB=200: .*125, 250, 500, 1000"),
    ({"kubernetesVersion": "1.29"}, r"kubernetesVersion='1.29'.*1.34, 1.35, 1.36.*kubectl"),
    ({"trainerChartVersion": "2.1.0"}, r"trainerChartVersion='2.1.0'.*>= 2.2.0"),
    ({"trainerChartVersion": "3.0.0"}, r"trainerChartVersion='3.0.0'"),
    ({"bucketName": "Bad_Bucket"}, r"bucketName='Bad_Bucket': not a valid S3 bucket name"),
    ({"s3Prefix": "t5"}, r"s3Prefix='t5'.*trailing '/'"),
    ({"account": "1234"}, r"account='1234': an AWS account id is 12 digits"),
    ({"region": "mars"}, r"region='mars'"),
    ({"availabilityZones": "us-east-1a"}, r"availabilityZones=\['us-east-1a'\]: list exactly maxAzs \(2\)"),
    ({"availabilityZones": "us-west-2a,us-west-2b", "region": "us-east-1"}, r"us-west-2a.*not in region us-east-1"),
    ({"namePrefix": "T5"}, r"namePrefix='T5'"),
    ({"vpcCidr": "10.0.0.0/8"}, r"vpcCidr='10.0.0.0/8': use an IPv4 block from /16 to /20"),
    ({"natGateways": "0"}, r"natGateways=0.*NAT"),
    ({"headNodeInstanceType": "p5.48xlarge"}, r"not a GPU type"),
    # typos and sizes that do not exist: refused at synth, not minutes into a deploy
    (
        {"headNodeInstanceType": "m7i.2xlarg"},
        r"headNodeInstanceType='m7i.2xlarg': not an EC2 instance type.*"
        r"pass an existing one, e.g. -c headNodeInstanceType=m7i.2xlarge",
    ),
    ({"headNodeInstanceType": "m7i.3xlarge"}, r"headNodeInstanceType='m7i.3xlarge': not an EC2 instance type"),
    ({"systemInstanceType": "foo.bar"}, r"systemInstanceType='foo.bar': not an EC2 instance type"),
    ({"trainingNamespace": "kube-system"}, r"trainingNamespace='kube-system'"),
    ({"runtimeName": "T5_Runtime"}, r"runtimeName='T5_Runtime'.*DNS-1123"),
    ({"adminRoleArn": "admin"}, r"adminRoleArn='admin'"),
    ({"apiAllowedCidrs": "everywhere"}, r"apiAllowedCidrs='everywhere'"),
    # IPv6 (here "open to the world"): EKS refuses IPv6 CIDRs for an IPv4 cluster's endpoint at deploy time
    ({"apiAllowedCidrs": "::/0"}, r"apiAllowedCidrs='::/0': an IPv6 CIDR.*pass IPv4 CIDRs such as 203.0.113.0/24"),
    ({"apiAllowedCidrs": "203.0.113.0/24,2001:db8::/32"}, r"apiAllowedCidrs='2001:db8::/32': an IPv6 CIDR"),
    ({"maxRestarts": "-1"}, r"maxRestarts=-1"),
    ({"gpuRootVolumeGiB": "20"}, r"gpuRootVolumeGiB=20"),
]


@pytest.mark.parametrize("context,message", BAD_INPUTS, ids=[next(iter(c)) for c, _ in BAD_INPUTS])
def test_bad_inputs_fail_with_the_value_and_the_fix(context: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        InfraConfig.from_context(context)
    assert str(err.value).startswith("context ")


@pytest.mark.parametrize(
    "instance_type", ["m7i.xlarge", "m7i-flex.large", "c7gn.metal", "m7i.metal-24xl", "u-6tb1.112xlarge", "t3.nano"]
)
def test_existing_instance_types_pass_for_the_head_and_system_nodes(instance_type: str) -> None:
    cfg = InfraConfig.from_context({"headNodeInstanceType": instance_type, "systemInstanceType": instance_type})
    assert (cfg.head_node_instance_type, cfg.system_instance_type) == (instance_type, instance_type)
    assert EC2_INSTANCE_TYPE.fullmatch(instance_type)  # the check used where botocore is missing agrees


@pytest.mark.parametrize("typo", ["m7i.2xlarg", "m7i.big", "foo.bar", "m7i", "M7i.xlarge"])
def test_the_pattern_alone_refuses_typos(typo: str) -> None:
    assert not EC2_INSTANCE_TYPE.fullmatch(typo)


def test_unknown_keys_are_reported_but_cdk_keys_are_not() -> None:
    ctx = {
        "gpuInstanceTyp": "x",
        "platform": "eks",
        "@aws-cdk/core:x": True,
        "aws:cdk:enable-path-metadata": True,
        "availability-zones:account=1:region=r": [],
    }
    assert InfraConfig.unknown_keys(ctx) == ["gpuInstanceTyp"]


def test_every_supported_instance_type_has_one_efa_per_network_card() -> None:
    assert {"p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "g6e.48xlarge"} <= set(GPU_INSTANCES)
    assert {
        t: (s.gpus, s.efa_interfaces)
        for t, s in GPU_INSTANCES.items()
        if t in ("p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "g6e.48xlarge")
    } == {"p4d.24xlarge": (8, 4), "p5.48xlarge": (8, 32), "p5en.48xlarge": (8, 16), "g6e.48xlarge": (8, 4)}
    for spec in GPU_INSTANCES.values():
        assert spec.efa_interfaces == spec.network_cards
        assert re.fullmatch(r"[a-z][a-z0-9-]*", spec.compute_resource_name)
    with pytest.raises(ValueError, match="p9.x.*not a supported GPU instance type"):
        gpu_instance("p9.x")


def test_cdk_json_documents_every_key_with_matching_defaults() -> None:
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    assert cdk_json["notices"] is False
    assert cdk_json["app"] == ".venv/bin/python app.py"
    ctx = cdk_json["context"]
    keys = set(InfraConfig.context_keys())
    assert set(ctx["//keys"]) == keys, "cdk.json //keys must document exactly the InfraConfig keys"
    assert all(len(doc) > 20 for doc in ctx["//keys"].values())
    for key, value in defaults().items():
        if value is None:
            assert key not in ctx, f"{key}: optional keys are documented, not set"
        else:
            assert ctx[key] == value, f"cdk.json {key}={ctx[key]!r} differs from the InfraConfig default {value!r}"
    assert field_docs().keys() == keys, "every InfraConfig field needs a docstring"
    assert ctx["//keys"] == field_docs(), "cdk.json //keys must repeat the InfraConfig field docstrings"


def test_deploy_guide_lists_every_context_key() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text()
    missing = [k for k in InfraConfig.context_keys() if f"`{k}`" not in guide]
    assert not missing, f"docs/deploy.md context-key table lacks {missing}"

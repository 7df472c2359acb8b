"""The operator's path: saved deploy settings that survive a redeploy (synthesized from what the CDK CLI reads),
make deploy / make destroy dry runs, a destroy that leaves nothing a new deploy collides with, a private API by
default, capacity reservations on both platforms, and least-privilege S3 prefixes where the jobs really write."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Capture, Match, Template

from stacks.config import ConfigError, InfraConfig
from stacks.deploy_config import load_saved, merge_settings, plan_deploy, save, settings_line
from stacks.synth_check import file_context
from tests.support.infra import ROOT, Synthesized, manifests, resources_of_type, synthesize

ADMIN = "arn:aws:iam::123456789012:role/PlatformAdmin"
FIRST_DEPLOY = ["-c", f"adminRoleArn={ADMIN}", "-c", "gpuNodes=3", "-c", "apiAllowedCidrs=203.0.113.7/32"]
NEW_TAG = "src-0123456789ab"


def project_root(tmp_path: Path) -> Path:
    """A scratch project root with the real cdk.json (the saved settings go next to it)."""
    shutil.copy(ROOT / "cdk.json", tmp_path / "cdk.json")
    return tmp_path


def deploy(root: Path, platform: str, *argv: str) -> dict[str, Any]:
    plan = plan_deploy(platform, list(argv), root)
    save(plan.saved, root)
    return plan.saved


def test_saved_settings_survive_a_redeploy_that_passes_one_new_value(tmp_path: Path) -> None:
    root = project_root(tmp_path)
    deploy(root, "eks", *FIRST_DEPLOY)
    saved = deploy(root, "eks", "-c", f"imageTag={NEW_TAG}")  # the redeploy docs/deploy.md and make image suggest
    assert saved == {"adminRoleArn": ADMIN, "gpuNodes": 3, "apiAllowedCidrs": ["203.0.113.7/32"], "imageTag": NEW_TAG}

    # Synthesize from exactly what the CDK CLI merges (cdk.json, then cdk.context.json): nothing fell back.
    context = {k: v for k, v in file_context(root).items() if not k.startswith("//")}
    t = synthesize({**context, "platform": "eks"}, tmp_path / "cdk.out").templates["Eks"]
    template = Template.from_json(t)
    template.has_resource_properties("AWS::EKS::AccessEntry", {"PrincipalArn": ADMIN})
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "ResourcesVpcConfig": Match.object_like(
                {"EndpointPublicAccess": True, "PublicAccessCidrs": ["203.0.113.7/32"]}
            )
        },
    )
    (gpu,) = [
        r for _, r in resources_of_type(t, "AWS::EKS::Nodegroup") if r["Properties"]["AmiType"].endswith("NVIDIA")
    ]
    assert gpu["Properties"]["ScalingConfig"] == {"DesiredSize": 3, "MinSize": 3, "MaxSize": 3}
    (runtime,) = [
        m
        for _, r in resources_of_type(t, "Custom::AWSCDK-EKS-KubernetesResource")
        for m in manifests(r)
        if m["kind"] == "ClusterTrainingRuntime"
    ]
    images = {
        c["image"]
        for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for c in j["template"]["spec"]["template"]["spec"]["containers"]
    }
    assert images and all(i.endswith(f":{NEW_TAG}") for i in images), images


def test_a_redeploy_can_drop_a_saved_value_and_keeps_cdk_lookups(tmp_path: Path) -> None:
    root = project_root(tmp_path)
    lookup = {"availability-zones:account=123456789012:region=us-east-1": ["us-east-1a", "us-east-1b"]}
    save(lookup, root)
    deploy(root, "parallelcluster", "-c", "sshKeyName=my-key", "-c", "gpuNodes=4")
    saved = deploy(root, "parallelcluster", "-c", "sshKeyName=")
    assert saved == {**lookup, "gpuNodes": 4}
    assert load_saved(root) == saved


@pytest.mark.parametrize("missing", ["apiAllowedCidrs", "adminRoleArn"])
def test_an_eks_deploy_stops_until_the_api_access_and_the_admin_are_chosen(tmp_path: Path, missing: str) -> None:
    root = project_root(tmp_path)
    args = [a for a in FIRST_DEPLOY if not a.startswith(missing)]
    args = [a for i, a in enumerate(args) if not (a == "-c" and (i + 1 == len(args) or args[i + 1] == "-c"))]
    with pytest.raises(ConfigError, match=rf"^{missing} is not set .*: pass "):
        plan_deploy("eks", args, root)
    assert not (root / "cdk.context.json").exists(), "nothing is saved from a refused deploy"
    # a private endpoint is a valid choice: [] counts as set
    assert (
        plan_deploy("eks", ["-c", f"adminRoleArn={ADMIN}", "-c", "apiAllowedCidrs=[]"], root).config.api_allowed_cidrs
        == ()
    )


def test_bad_values_are_refused_before_anything_is_saved(tmp_path: Path) -> None:
    root = project_root(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown context key 'GpuNodes' \(did you mean gpuNodes\?\)"):
        plan_deploy("parallelcluster", ["-c", "GpuNodes=4"], root)
    with pytest.raises(ConfigError, match=r"gpuNodes=0: need at least 1"):
        plan_deploy("parallelcluster", ["-c", "gpuNodes=0"], root)
    (root / "cdk.context.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"cdk.context.json: not valid JSON"):
        plan_deploy("parallelcluster", [], root)


def run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_a_parallelcluster_deploy_lists_the_eks_only_settings_apart(tmp_path: Path) -> None:
    # One settings file serves both platforms: after an EKS deploy, a ParallelCluster deploy's settings line says
    # which saved values it does not use (they are kept for the next EKS deploy), and the EKS line lists them all.
    root = project_root(tmp_path)
    saved = deploy(root, "eks", *FIRST_DEPLOY, "-c", f"imageTag={NEW_TAG}")
    assert settings_line(saved, "eks") == (
        f'adminRoleArn="{ADMIN}", gpuNodes=3, apiAllowedCidrs=["203.0.113.7/32"], imageTag="{NEW_TAG}"'
    )
    assert settings_line(saved, "parallelcluster") == (
        "gpuNodes=3; kept for EKS, unused by parallelcluster: adminRoleArn, apiAllowedCidrs, imageTag"
    )
    assert settings_line({}, "parallelcluster") == "(none: the cdk.json defaults)"


def test_the_eks_only_settings_do_not_change_the_parallelcluster_stacks(tmp_path: Path) -> None:
    # What the line above calls unused must really be: a ParallelCluster synth with every EKS-only key set to a
    # non-default value gives the same templates as one without them.
    eks_only = {
        "kubernetesVersion": "1.34",
        "trainerChartVersion": "2.2.0",
        "trainingNamespace": "other",
        "runtimeName": "other-runtime",
        "maxRestarts": "7",
        "imageTag": NEW_TAG,
        "adminRoleArn": ADMIN,
        "apiAllowedCidrs": "203.0.113.7/32",
    }
    assert set(eks_only) == InfraConfig.eks_only_keys()
    plain = synthesize({"platform": "parallelcluster"}, tmp_path / "a").templates
    with_eks_keys = synthesize({"platform": "parallelcluster", **eks_only}, tmp_path / "b").templates
    assert with_eks_keys == plain


def test_make_deploy_and_destroy_dry_runs_print_the_commands_and_change_nothing() -> None:
    saved = ROOT / "cdk.context.json"
    before = saved.read_text() if saved.exists() else None
    proc = run_script("deploy.sh", *FIRST_DEPLOY, PLATFORM="eks", DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    assert "[deploy] would save to cdk.context.json: adminRoleArn=" in proc.stderr
    assert "[deploy] would run: node_modules/.bin/cdk deploy --all -c platform=eks" in proc.stdout
    proc = run_script("destroy.sh", "--cluster-only", PLATFORM="slurm", DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    assert "deletes t5ft-pcluster; keeps t5ft-storage and t5ft-network" in proc.stderr
    assert "would run: node_modules/.bin/cdk destroy -c platform=parallelcluster ParallelCluster" in proc.stdout
    assert (saved.read_text() if saved.exists() else None) == before
    proc = run_script("deploy.sh", PLATFORM="k8s", DRY_RUN="1")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: PLATFORM=k8s: deploy supports PLATFORM=eks or PLATFORM=parallelcluster"
    ]


# ---------------------------------------------------------------- teardown: nothing a new deploy collides with
NAME_PROPERTIES = (
    "BucketName",
    "RepositoryName",
    "LogGroupName",
    "TableName",
    "FileSystemName",
    "Name",
    "RoleName",
    "PolicyName",
    "ManagedPolicyName",
    "ClusterName",
    "KeyAlias",
    "AliasName",
)


@pytest.mark.parametrize("app", ["eks", "pcluster"])
def test_a_synth_after_a_destroy_needs_no_retained_resource(app: str, request: pytest.FixtureRequest) -> None:
    """Everything a destroy keeps has a generated name, so the next deploy creates new resources beside it instead
    of failing with "already exists"; the ECR repository (fixed name) is deleted, images included."""
    synthesized: Synthesized = request.getfixturevalue(app)
    kept = []
    for stack, template in synthesized.templates.items():
        for logical_id, res in template["Resources"].items():
            if res.get("DeletionPolicy") == "Retain" or res.get("UpdateReplacePolicy") == "Retain":
                fixed = [p for p in NAME_PROPERTIES if isinstance(res.get("Properties", {}).get(p), str)]
                assert not fixed, (
                    f"{stack}/{logical_id} ({res['Type']}) is retained with a fixed {fixed}: a "
                    "deploy after a destroy would collide with it"
                )
                kept.append(res["Type"])
    assert set(kept) <= {"AWS::S3::Bucket"}, kept
    storage = synthesized.template("Storage")
    storage.has_resource(
        "AWS::ECR::Repository",
        {
            "DeletionPolicy": "Delete",
            "Properties": Match.object_like({"RepositoryName": "t5ft/t5-train", "EmptyOnDelete": True}),
        },
    )


def test_no_lifecycle_rule_can_expire_an_image_a_job_uses(eks: Synthesized) -> None:
    (repo,) = [r for _, r in resources_of_type(eks.templates["Storage"], "AWS::ECR::Repository")]
    assert "LifecyclePolicy" not in repo["Properties"]
    assert repo["Properties"]["ImageTagMutability"] == "IMMUTABLE"


def test_the_control_plane_log_group_is_the_stacks_and_goes_with_it(eks: Synthesized) -> None:
    t = eks.template("Eks")
    group = Capture()
    t.has_resource(
        "AWS::Logs::LogGroup",
        {
            "DeletionPolicy": "Delete",
            "Properties": {
                "LogGroupName": "/aws/eks/t5ft-gpu/cluster",
                "RetentionInDays": 30,
                "Tags": Match.any_value(),
            },
        },
    )
    (log_id,) = [
        k
        for k, r in resources_of_type(eks.templates["Eks"], "AWS::Logs::LogGroup")
        if r["Properties"]["LogGroupName"] == "/aws/eks/t5ft-gpu/cluster"
    ]
    # created before the cluster (or EKS would create its own, outside the stack), deleted after it
    t.has_resource("AWS::EKS::Cluster", {"DependsOn": group})
    assert log_id in group.as_array()


# ---------------------------------------------------------------- secure defaults
def test_the_default_api_endpoint_is_private(eks: Synthesized) -> None:
    assert InfraConfig().api_allowed_cidrs == ()
    eks.template("Eks").has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "ResourcesVpcConfig": Match.object_like(
                {"EndpointPublicAccess": False, "EndpointPrivateAccess": True, "PublicAccessCidrs": Match.absent()}
            )
        },
    )


def test_parallelcluster_nodes_write_only_where_slurm_jobs_write(pcluster: Synthesized) -> None:
    from cluster_assets.slurm.config import SlurmJobConfig  # noqa: PLC0415
    from cluster_facts import FSX_MOUNT_PATH  # noqa: PLC0415

    (cr,) = [r for _, r in resources_of_type(pcluster.templates["ParallelCluster"], "Custom::PclusterCluster")]
    cfg = cr["Properties"]["ClusterConfiguration"]
    for iam in (cfg["HeadNode"]["Iam"], cfg["Scheduling"]["SlurmQueues"][0]["Iam"]):
        assert all("KeyName" in a for a in iam["S3Access"]), "an entry without KeyName grants the whole bucket"
        by_key = {
            a["KeyName"]: a["EnableWriteAccess"]
            for a in iam["S3Access"]
            if a["BucketName"] == "example-existing-training-bucket"
        }
        assert by_key == {"t5/data/*": False, "t5/checkpoints/*": True, "t5/runs/*": True}, by_key
    # ... the directories the Slurm job really writes (relative to /fsx = the bucket's s3Prefix)
    job = SlurmJobConfig(run_name="t5-run", shared_dir=FSX_MOUNT_PATH)
    for path in (job.checkpoint_dir, job.run_dir):
        key = "t5/" + path.removeprefix(FSX_MOUNT_PATH.rstrip("/") + "/") + "/x"
        assert any(key.startswith(k.removesuffix("*")) for k in ("t5/checkpoints/*", "t5/runs/*")), key


# ---------------------------------------------------------------- capacity reservations
RESERVATION = {
    "capacityReservationId": "cr-0123456789abcdef0",
    "placementGroup": "false",
    "availabilityZones": "us-east-1c,us-east-1a",
}


def test_eks_gpu_nodes_launch_into_a_capacity_block(eks_capacity_block: Synthesized) -> None:
    t = eks_capacity_block.templates["Eks"]
    template = Template.from_json(t)
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "CapacityReservationSpecification": {
                        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
                    },
                    "InstanceMarketOptions": {"MarketType": "capacity-block"},
                    "Placement": Match.absent(),
                }
            )
        },
    )
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    (gpu,) = [
        r for _, r in resources_of_type(t, "AWS::EKS::Nodegroup") if r["Properties"]["AmiType"].endswith("NVIDIA")
    ]
    assert gpu["Properties"]["CapacityType"] == "CAPACITY_BLOCK"
    assert len(gpu["Properties"]["Subnets"]) == 1  # only the reservation's AZ


def test_an_on_demand_capacity_reservation_keeps_on_demand_capacity() -> None:
    import aws_cdk as cdk  # noqa: PLC0415

    from cluster_facts import gpu_instance  # noqa: PLC0415
    from stacks.components.gpu_launch_template import GpuLaunchTemplate  # noqa: PLC0415

    stack = cdk.Stack(cdk.App())
    GpuLaunchTemplate(
        stack,
        "T",
        spec=gpu_instance("p4d.24xlarge"),
        security_group_ids=["sg-1"],
        placement_group=False,
        root_volume_gib=200,
        capacity_reservation_id="cr-0123456789abcdef0",
    )
    data = Template.from_stack(stack).find_resources("AWS::EC2::LaunchTemplate")
    (lt,) = data.values()
    assert lt["Properties"]["LaunchTemplateData"]["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert "InstanceMarketOptions" not in lt["Properties"]["LaunchTemplateData"]


@pytest.mark.parametrize(
    "context,message",
    [
        ({"capacityBlock": "true"}, r"capacityBlock=True: .*also set capacityReservationId=cr-"),
        ({"capacityReservationId": "cr-0123456789abcdef0"}, r"placementGroup=True: .*set placementGroup=false"),
        (
            {"capacityReservationId": "reservation-1", "placementGroup": "false"},
            r"capacityReservationId='reservation-1'",
        ),
    ],
)
def test_reservation_settings_are_checked_at_synth(context: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        InfraConfig.from_context(context)


def test_a_deploy_with_a_reservation_needs_its_az(tmp_path: Path) -> None:
    root = project_root(tmp_path)
    with pytest.raises(ConfigError, match=r"availabilityZones is not set: run `make preflight PLATFORM=parallel"):
        plan_deploy(
            "parallelcluster", ["-c", "capacityReservationId=cr-0123456789abcdef0", "-c", "placementGroup=false"], root
        )
    # preflight may take it (it finds the AZ), a deploy once the AZ is saved too
    assert merge_settings(
        "parallelcluster", ["-c", "capacityReservationId=cr-0123456789abcdef0", "-c", "placementGroup=false"], root
    ).config.capacity_reservation_id
    assert plan_deploy("parallelcluster", [f"--context={k}={v}" for k, v in RESERVATION.items()], root)

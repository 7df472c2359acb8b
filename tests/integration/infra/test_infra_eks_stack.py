"""Intent of the EKS stack: GPU nodes in a placement group with EFA, NVIDIA AMI, IMDSv2, taint; add-ons,
pinned charts, the fault-tolerant runtime, FSx volume, least-privilege S3 access, outputs."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Capture, Match

from stacks import versions
from tests.support.infra import Synthesized, manifests, resources_of_type


def _gpu_launch_template(eks: Synthesized) -> dict[str, Any]:
    (lt,) = [r for _, r in resources_of_type(eks.templates["Eks"], "AWS::EC2::LaunchTemplate")]
    return lt["Properties"]["LaunchTemplateData"]


def _all_manifests(eks: Synthesized) -> list[dict[str, Any]]:
    return [
        m
        for _, r in resources_of_type(eks.templates["Eks"], "Custom::AWSCDK-EKS-KubernetesResource")
        for m in manifests(r)
    ]


def test_gpu_launch_template_is_in_a_cluster_placement_group(eks: Synthesized) -> None:
    t = eks.template("Eks")
    group = Capture()
    t.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    t.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": Match.object_like({"Placement": {"GroupName": {"Fn::GetAtt": [group, "GroupName"]}}})},
    )
    assert eks.templates["Eks"]["Resources"][group.as_string()]["Type"] == "AWS::EC2::PlacementGroup"


def test_gpu_launch_template_has_one_efa_per_network_card(eks: Synthesized) -> None:
    data = _gpu_launch_template(eks)
    assert data["InstanceType"] == "p5.48xlarge"
    nics = data["NetworkInterfaces"]
    assert len(nics) == 32
    assert [n["NetworkCardIndex"] for n in nics] == list(range(32))
    assert nics[0]["InterfaceType"] == "efa" and nics[0]["DeviceIndex"] == 0
    assert {n["InterfaceType"] for n in nics[1:]} == {"efa-only"}
    for nic in nics:  # interfaces replace instance-level groups: the cluster SG must be on every one
        assert any(
            isinstance(g, dict) and g.get("Fn::GetAtt", [None, None])[1] == "ClusterSecurityGroupId"
            for g in nic["Groups"]
        )
        assert len(nic["Groups"]) == 2  # + the Lustre client group


def test_gpu_nodes_require_imdsv2_and_encrypted_volumes(eks: Synthesized) -> None:
    data = _gpu_launch_template(eks)
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    (bdm,) = data["BlockDeviceMappings"]
    assert bdm["Ebs"]["Encrypted"] is True and bdm["Ebs"]["VolumeType"] == "gp3"


def test_gpu_node_group_uses_nvidia_ami_taint_and_one_subnet(eks: Synthesized) -> None:
    t = eks.template("Eks")
    t.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_NVIDIA",
            "LaunchTemplate": {"Id": {"Ref": Match.any_value()}, "Version": Match.any_value()},
            "Taints": [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"}],
            "ScalingConfig": {"DesiredSize": 2, "MinSize": 2, "MaxSize": 2},
            "NodeRepairConfig": {"Enabled": True},
            "InstanceTypes": Match.absent(),  # the instance type lives in the launch template (p5 gap upstream)
        },
    )
    (gpu,) = [
        r
        for _, r in resources_of_type(eks.templates["Eks"], "AWS::EKS::Nodegroup")
        if r["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"
    ]
    assert len(gpu["Properties"]["Subnets"]) == 1
    assert gpu["Properties"]["Labels"]["nvidia.com/gpu.present"] == "true"


def test_cluster_version_logging_encryption_and_no_auto_mode(eks: Synthesized) -> None:
    eks.template("Eks").has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": "1.35",
            "ComputeConfig": {"Enabled": False},
            "EncryptionConfig": [Match.object_like({"Resources": ["secrets"]})],
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": [
                        {"Type": t} for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")
                    ]
                }
            },
        },
    )
    eks.template("Eks").has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_pod_identity_fsx_csi_and_vpc_cni_addons(eks: Synthesized) -> None:
    t = eks.template("Eks")
    for name in ("eks-pod-identity-agent", "aws-fsx-csi-driver"):
        t.has_resource_properties("AWS::EKS::Addon", {"AddonName": name})
    # network policies are enforced only when the VPC CNI's node agent is on
    t.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "vpc-cni",
            "ResolveConflicts": "OVERWRITE",
            "ConfigurationValues": Match.serialized_json({"enableNetworkPolicy": "true"}),
        },
    )
    t.resource_count_is("AWS::EKS::Addon", 4)


def test_ebs_csi_driver_provisions_the_etcd_volumes_through_pod_identity(eks: Synthesized) -> None:
    t = eks.template("Eks")
    t.has_resource_properties("AWS::EKS::Addon", {"AddonName": "aws-ebs-csi-driver"})
    t.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation", {"Namespace": "kube-system", "ServiceAccount": "ebs-csi-controller-sa"}
    )
    # three system nodes: the etcd members need one each (required anti-affinity), one group per AZ
    # (test_infra_eks_system_nodes_per_az.py)
    t.resource_properties_count_is("AWS::EKS::Nodegroup", {"AmiType": "AL2023_x86_64_STANDARD"}, 2)


def test_the_stack_installs_the_jobs_etcd_closed_to_all_but_training_pods(eks: Synthesized) -> None:
    """What the stack applies is exactly what cluster_assets/k8s/etcd.py renders (image tag from context), valid
    against the kubernetes client's models; the NetworkPolicy admits the label the installed runtime's pods carry."""
    from cluster_assets.k8s import etcd, schema

    objs = [
        m
        for m in _all_manifests(eks)
        if m["metadata"].get("namespace") == "t5-etcd"
        or m["kind"] in ("StorageClass",)
        or (m["kind"] == "Namespace" and m["metadata"]["name"] == "t5-etcd")
        or (m["kind"] in ("Role", "RoleBinding") and m["metadata"]["name"].startswith("t5-etcd-"))
    ]
    (sts,) = [m for m in objs if m["kind"] == "StatefulSet"]
    image = next(m for m in objs if m["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert not image.endswith(":0.1.0")  # not the training image: the stack's (test_infra_etcd_admin_image.py)
    want = etcd.cluster_objects(
        admin_image=image, training_namespace="training", node_selector={"t5-failover/pool": "system"}
    )
    want_objs = [m for g in want.values() for m in g]
    ident = lambda m: (m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"])  # noqa: E731
    # the bootstrap Job's name carries a digest of its spec, whose image is a CloudFormation token at synth time
    assert sorted(ident(m) for m in objs if m["kind"] != "Job") == sorted(
        ident(m) for m in want_objs if m["kind"] != "Job"
    )
    installed = {ident(m): m for m in objs}
    for m in want_objs:
        if m["kind"] in ("StatefulSet", "PodDisruptionBudget", "NetworkPolicy", "Service", "StorageClass", "Role"):
            got = installed[ident(m)]
            assert {**got, "metadata": {**got["metadata"], "labels": m["metadata"].get("labels")}} == m
    for m in objs:
        schema.roundtrip_core(m)
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["template"]["spec"]["nodeSelector"] == {
        "t5-failover/pool": "system"
    }
    (policy,) = [m for m in objs if m["kind"] == "NetworkPolicy"]
    (rt,) = [m for m in _all_manifests(eks) if m["kind"] == "ClusterTrainingRuntime"]
    (node,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    training = node["template"]["spec"]["template"]["metadata"]["labels"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "training"}},
        "podSelector": {"matchLabels": training},
    } in [p for r in policy["spec"]["ingress"] for p in r["from"]]
    # no store NetworkPolicy any more (there is no store pod)
    assert [m["metadata"]["name"] for m in _all_manifests(eks) if m["kind"] == "NetworkPolicy"] == [
        "etcd-from-training-pods"
    ]


def test_etcd_members_come_after_the_ebs_driver_and_admin_after_the_training_namespace(eks: Synthesized) -> None:
    res = eks.templates["Eks"]["Resources"]

    def holding(kind: str) -> str:
        (rid,) = [
            k
            for k, r in res.items()
            if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource" and any(m["kind"] == kind for m in manifests(r))
        ]
        return rid

    (ebs,) = [
        k
        for k, r in res.items()
        if r["Type"] == "AWS::EKS::Addon" and r["Properties"]["AddonName"] == "aws-ebs-csi-driver"
    ]
    assert ebs in res[holding("StatefulSet")]["DependsOn"]
    (training_ns,) = [
        k
        for k, r in res.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and {"kind": "Namespace", "name": "training"}
        in [{"kind": m["kind"], "name": m["metadata"]["name"]} for m in manifests(r)]
    ]
    # the administration (its Roles in the training namespace, the bootstrap Job, the renewal CronJob) after the
    # training namespace; the code's ConfigMap goes with the members, which run its repair module at every start
    assert training_ns in res[holding("CronJob")]["DependsOn"]
    assert holding("ConfigMap") == holding("StatefulSet")


def test_helm_charts_are_pinned(eks: Synthesized) -> None:
    t = eks.template("Eks")
    t.has_resource_properties(
        "Custom::AWSCDK-EKS-HelmChart",
        {
            "Repository": "oci://ghcr.io/kubeflow/charts/kubeflow-trainer",
            "Version": "2.3.0",
            "Namespace": "kubeflow-system",
            "Wait": True,
            "Values": Match.serialized_json(
                Match.object_like(
                    {
                        "jobset": {"install": True},
                        "manager": Match.object_like({"config": {"featureGates": {"TrainJobStatus": True}}}),
                    }
                )
            ),
        },
    )  # progress into trainerStatus
    t.has_resource_properties(
        "Custom::AWSCDK-EKS-HelmChart",
        {
            "Chart": "nvidia-device-plugin",
            "Version": versions.NVIDIA_DEVICE_PLUGIN_VERSION,
            "Values": Match.serialized_json(
                Match.object_like({"tolerations": [Match.object_like({"key": "nvidia.com/gpu"})]})
            ),
        },
    )
    t.has_resource_properties(
        "Custom::AWSCDK-EKS-HelmChart",
        {"Chart": "aws-efa-k8s-device-plugin", "Version": versions.EFA_DEVICE_PLUGIN_VERSION},
    )
    for _, chart in resources_of_type(eks.templates["Eks"], "Custom::AWSCDK-EKS-HelmChart"):
        assert chart["Properties"].get("Version"), f"unpinned chart {chart['Properties'].get('Chart')}"


def test_training_runtime_is_installed_after_the_trainer_chart(eks: Synthesized) -> None:
    res = eks.templates["Eks"]["Resources"]
    (chart_id,) = [
        k
        for k, r in res.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"].get("Chart") == "kubeflow-trainer"
    ]
    (rt_id,) = [
        k
        for k, r in res.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and any(m["kind"] == "ClusterTrainingRuntime" for m in manifests(r))
    ]
    assert chart_id in res[rt_id].get("DependsOn", [])


def test_runtime_manifest_restart_policy_and_devices(eks: Synthesized) -> None:
    (rt,) = [m for m in _all_manifests(eks) if m["kind"] == "ClusterTrainingRuntime"]
    assert rt["metadata"]["name"] == "t5-fault-tolerant"
    spec = rt["spec"]["template"]["spec"]
    assert spec["failurePolicy"]["maxRestarts"] == 10
    (node,) = spec["replicatedJobs"]  # no store job: membership is the cluster's etcd
    job = node["template"]["spec"]
    assert job["backoffLimitPerIndex"] == 3 and job["maxFailedIndexes"] == 0
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    (container,) = job["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert job["template"]["spec"]["nodeSelector"] == {"t5-failover/pool": "gpu"}
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in job["template"]["spec"]["volumes"]
    assert container["image"].endswith(":0.1.0")  # <ECR repository URI>:imageTag


def test_fsx_static_volume_and_claim_in_the_training_namespace(eks: Synthesized) -> None:
    objs = _all_manifests(eks)
    (ns,) = [m for m in objs if m["kind"] == "Namespace" and m["metadata"]["name"] != "t5-etcd"]
    (pv,) = [m for m in objs if m["kind"] == "PersistentVolume"]
    (pvc,) = [m for m in objs if m["kind"] == "PersistentVolumeClaim"]
    assert ns["metadata"]["name"] == pvc["metadata"]["namespace"] == "training"
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert set(pv["spec"]["csi"]["volumeAttributes"]) == {"dnsname", "mountname"}
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["storageClassName"] == pvc["spec"]["storageClassName"] == ""
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" and "flock" in pv["spec"]["mountOptions"]


def test_training_pods_get_least_privilege_s3_access(eks: Synthesized) -> None:
    t = eks.template("Eks")
    t.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation", {"Namespace": "training", "ServiceAccount": "t5-train"}
    )
    policies = [
        r["Properties"]["PolicyDocument"]["Statement"]
        for _, r in resources_of_type(eks.templates["Eks"], "AWS::IAM::Policy")
        if any(s.get("Sid") == "ReadWriteJobs" for s in r["Properties"]["PolicyDocument"]["Statement"])
    ]
    (statements,) = policies
    by_sid = {s["Sid"]: s for s in statements}
    assert set(by_sid) == {"ListTrainingPrefixes", "ReadData", "ReadWriteJobs"}
    assert by_sid["ReadData"]["Action"] == "s3:GetObject"
    assert "s3:*" not in str(statements) and "s3:DeleteBucket" not in str(statements)
    assert json.dumps(by_sid["ReadData"]["Resource"]).endswith('"/data/*"]]}')
    assert json.dumps(by_sid["ReadWriteJobs"]["Resource"]).endswith('"/jobs/*"]]}')
    assert by_sid["ListTrainingPrefixes"]["Condition"] == {"StringLike": {"s3:prefix": ["data/*", "jobs/*"]}}


def test_pods_may_write_where_a_trainjob_puts_its_checkpoints(eks: Synthesized) -> None:
    """The write grant covers the S3 key FSx exports a TrainJob's checkpoints to (/fsx/jobs/<name>/checkpoints ->
    s3://<bucket>/<s3Prefix>jobs/<name>/checkpoints), as the real TrainJob renderer names that directory."""
    from cluster_assets.k8s.trainjob import TrainJobConfig  # noqa: PLC0415
    from cluster_facts import FSX_MOUNT_PATH  # noqa: PLC0415

    job_dir = TrainJobConfig(name="t5-run", image="x", runtime_name="r", fsx_mount_path=FSX_MOUNT_PATH).job_dir
    checkpoint_key = f"{job_dir.removeprefix(FSX_MOUNT_PATH.rstrip('/') + '/')}/checkpoints/step_100/0.distcp"
    (write,) = [
        s
        for _, r in resources_of_type(eks.templates["Eks"], "AWS::IAM::Policy")
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        if s.get("Sid") == "ReadWriteJobs"
    ]
    prefix = write["Resource"]["Fn::Join"][1][-1].removeprefix("/").removesuffix("*")
    assert "s3:PutObject" in write["Action"]
    assert checkpoint_key.startswith(prefix), f"pods may write {prefix}*, jobs checkpoint to {checkpoint_key}"


def test_outputs_make_train_needs(eks: Synthesized) -> None:
    outputs = eks.templates["Eks"]["Outputs"]
    for name in (
        "ClusterName",
        "KubeconfigCommand",
        "EcrRepositoryUri",
        "FsxFileSystemId",
        "FsxMountName",
        "BucketName",
        "TrainingNamespace",
        "RuntimeName",
        "FsxClaimName",
        "GpusPerNode",
    ):
        assert name in outputs, name
    cmd = outputs["KubeconfigCommand"]["Value"]["Fn::Join"][1]
    assert cmd[0] == "aws eks update-kubeconfig --name "

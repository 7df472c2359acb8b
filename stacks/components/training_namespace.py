"""The training namespace: FSx static volume + claim, S3 service account (Pod Identity) and the runtime. The jobs'
membership store is the cluster's etcd (stacks/components/etcd_cluster.py), whose NetworkPolicy admits the training
pods of this namespace."""

from __future__ import annotations

from typing import Any, Mapping

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from constructs import Construct

from cluster_assets.k8s.runtime import build_cluster_training_runtime
from cluster_facts import FSX_PVC_NAME
from stacks.nag import acknowledge

FSX_CSI_DRIVER = "fsx.csi.aws.com"


def fsx_persistent_volume(
    *, name: str, file_system_id: str, dns_name: str, mount_name: str, capacity_gib: int
) -> dict[str, Any]:
    """Static PersistentVolume for an existing FSx for Lustre file system (ReadWriteMany, ``flock``)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": f"{capacity_gib}Gi"},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            # flock: torch.distributed.checkpoint and data-loader caches take POSIX locks.
            "mountOptions": ["flock"],
            # Data is the S3-backed file system's, never the cluster's: deleting the claim must not delete it.
            "persistentVolumeReclaimPolicy": "Retain",
            # Empty string = no dynamic provisioning; binds only to the claim below.
            "storageClassName": "",
            "csi": {
                "driver": FSX_CSI_DRIVER,
                "volumeHandle": file_system_id,
                "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
            },
        },
    }


def fsx_persistent_volume_claim(*, name: str, namespace: str, volume_name: str, capacity_gib: int) -> dict[str, Any]:
    """Claim bound to :func:`fsx_persistent_volume` by name."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": f"{capacity_gib}Gi"}},
        },
    }


class TrainingNamespace(Construct):
    """Namespace where TrainJobs run, with everything a job needs already in place.

    Attributes:
        pvc_name, service_account_name, runtime_name: names a TrainJob refers to.
        runtime: the ClusterTrainingRuntime dict as installed.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        file_system: fsx.LustreFileSystem,
        fsx_capacity_gib: int,
        bucket_arn: str,
        bucket_arn_nag_name: str,
        data_prefix: str,
        job_prefix: str,
        trainer_chart: eks.HelmChart,
        runtime_name: str,
        image: str,
        max_restarts: int,
        gpus_per_node: int,
        efa_per_node: int,
        gpudirect_rdma: bool,
        gpu_node_labels: Mapping[str, str],
        system_node_labels: Mapping[str, str],
        num_nodes: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.namespace = namespace
        self.pvc_name = FSX_PVC_NAME
        self.service_account_name = "t5-train"
        self.runtime_name = runtime_name
        ns = cluster.add_manifest(
            "Namespace",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {"app.kubernetes.io/part-of": "t5-failover"}},
            },
        )
        pv_name = f"{namespace}-fsx"
        storage = cluster.add_manifest(
            "FsxVolume",
            fsx_persistent_volume(
                name=pv_name,
                file_system_id=file_system.file_system_id,
                dns_name=file_system.dns_name,
                mount_name=file_system.mount_name,
                capacity_gib=fsx_capacity_gib,
            ),
            fsx_persistent_volume_claim(
                name=self.pvc_name, namespace=namespace, volume_name=pv_name, capacity_gib=fsx_capacity_gib
            ),
        )
        storage.node.add_dependency(ns)
        self.namespace_manifest = ns

        # Direct S3 access for pods (e.g. staging data or copying a checkpoint out), least privilege: read the
        # data prefix, read/write the jobs' prefix (a TrainJob writes /fsx/jobs/<name>/, which FSx exports to
        # s3://<bucket>/<s3Prefix>jobs/<name>/), nothing else in the bucket.
        sa = cluster.add_service_account(
            "TrainingServiceAccount",
            name=self.service_account_name,
            namespace=namespace,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        sa.node.add_dependency(ns)
        sa.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ListTrainingPrefixes",
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{data_prefix}*", f"{job_prefix}*"]}},
            )
        )
        sa.add_to_principal_policy(
            iam.PolicyStatement(sid="ReadData", actions=["s3:GetObject"], resources=[f"{bucket_arn}/{data_prefix}*"])
        )
        sa.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadWriteJobs",
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[f"{bucket_arn}/{job_prefix}*"],
            )
        )
        acknowledge(
            sa.role,
            f"AwsSolutions-IAM5[Resource::{bucket_arn_nag_name}/{data_prefix}*]",
            f"Read-only access to whatever training data is uploaded under s3://<bucket>/{data_prefix}; "
            "object keys are unknown at deploy time, so the grant is scoped to that one prefix.",
        )
        acknowledge(
            sa.role,
            f"AwsSolutions-IAM5[Resource::{bucket_arn_nag_name}/{job_prefix}*]",
            f"Each TrainJob writes checkpoints and metrics under s3://<bucket>/{job_prefix}<name>/ (its "
            "/fsx/jobs/<name>); the keys are created at run time, so the grant is scoped to that one prefix.",
        )

        self.runtime = build_cluster_training_runtime(
            name=runtime_name,
            pvc_name=self.pvc_name,
            image=image,
            max_restarts=max_restarts,
            gpus_per_node=gpus_per_node,
            efa_per_node=efa_per_node,
            gpudirect_rdma=gpudirect_rdma,
            num_nodes=num_nodes,
            node_selector=dict(gpu_node_labels),
            # Pods cannot reach IMDS (hop limit 1); boto3 and the AWS CLI need the region from the env.
            env={"AWS_REGION": cdk.Aws.REGION},
        )
        runtime = cluster.add_manifest("TrainingRuntime", self.runtime)
        # The CRD and its validating webhook come with the Trainer chart.
        runtime.node.add_dependency(trainer_chart)

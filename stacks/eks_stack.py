"""EKS deployment unit: cluster, GPU nodes, device plugins, Kubeflow Trainer, training namespace, the jobs' etcd."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from cluster_facts import FSX_MOUNT_PATH
from stacks.components.eks_charts import GpuDevicePlugins, KubeflowTrainer
from stacks.components.eks_cluster import SYSTEM_POOL_LABEL, TrainingEksCluster
from stacks.components.eks_gpu_nodes import GPU_POOL_LABEL, GpuNodeGroup
from stacks.components.etcd_cluster import EtcdCluster
from stacks.components.training_namespace import TrainingNamespace
from stacks.config import InfraConfig
from stacks.eks_nag import acknowledge_eks_findings
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack


class EksStack(cdk.Stack):
    """A GPU EKS cluster ready for ``TrainJob``s against the fault-tolerant runtime."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        network: NetworkStack,
        storage: StorageStack,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        # The S3 policy imports the bucket ARN by export name, which CDK cannot see as a reference.
        self.node.add_dependency(storage)
        subnets = network.gpu_subnets
        self.eks = TrainingEksCluster(
            self,
            "Eks",
            cluster_name=config.cluster_name,
            kubernetes_version=config.kubernetes_version,
            vpc=network.vpc,
            subnets=subnets,
            system_instance_type=config.system_instance_type,
            api_allowed_cidrs=config.api_allowed_cidrs,
            admin_principal_arn=config.admin_role_arn,
        )
        cluster = self.eks.cluster
        self.gpu_nodes = GpuNodeGroup(
            self,
            "Gpu",
            cluster=cluster,
            spec=config.gpu,
            node_count=config.gpu_nodes,
            subnets=subnets[: config.gpu_subnet_count],
            placement_group=config.placement_group,
            extra_security_group_ids=[storage.lustre.client_security_group.security_group_id],
            root_volume_gib=config.gpu_root_volume_gib,
            name_tag=f"{config.cluster_name}-node",
            capacity_reservation_id=config.capacity_reservation_id,
            capacity_block=config.capacity_block,
            capacity_block_window=config.capacity_block_window,
        )
        self.device_plugins = GpuDevicePlugins(self, "DevicePlugins", cluster=cluster, gpu_node_labels=GPU_POOL_LABEL)
        self.trainer = KubeflowTrainer(
            self,
            "Trainer",
            cluster=cluster,
            chart_version=config.trainer_chart_version,
            system_node_labels=SYSTEM_POOL_LABEL,
        )
        self.trainer.chart.node.add_dependency(self.eks.system_nodes)
        repo = storage.images.repository
        self.training = TrainingNamespace(
            self,
            "Training",
            cluster=cluster,
            namespace=config.training_namespace,
            file_system=storage.lustre.file_system,
            fsx_capacity_gib=config.fsx_storage_capacity_gib,
            bucket_arn=cdk.Fn.import_value(storage.bucket_arn_export_name),
            bucket_arn_nag_name=storage.bucket_arn_export_name,
            data_prefix=config.data_prefix,
            job_prefix=config.job_prefixes[0],
            trainer_chart=self.trainer.chart,
            runtime_name=config.runtime_name,
            image=f"{repo.repository_uri}:{config.image_tag}",
            max_restarts=config.max_restarts,
            gpus_per_node=config.gpu.gpus,
            efa_per_node=config.gpu.efa_interfaces,
            gpudirect_rdma=config.gpu.gpudirect_rdma,
            gpu_node_labels=GPU_POOL_LABEL,
            system_node_labels=SYSTEM_POOL_LABEL,
            num_nodes=config.gpu_nodes,
        )
        # The FSx CSI driver (its node plugin mounts the claim) is installed before the training namespace.
        self.training.node.add_dependency(self.eks.fsx_csi_driver)
        # The jobs' membership store; its administration Jobs run a small image the stack builds, never the training
        # image (whose tags come and go).
        self.etcd = EtcdCluster(
            self,
            "Etcd",
            cluster=cluster,
            training_namespace=config.training_namespace,
            training_namespace_manifest=self.training.namespace_manifest,
            system_node_labels=SYSTEM_POOL_LABEL,
            system_nodes=self.eks.system_nodes,
        )
        acknowledge_eks_findings(
            self, cluster=cluster, nodegroups=[*self.eks.system_nodegroups, self.gpu_nodes.nodegroup]
        )

        region = cdk.Aws.REGION
        for name, value, desc in (
            ("ClusterName", cluster.cluster_name, "EKS cluster name"),
            (
                "KubeconfigCommand",
                f"aws eks update-kubeconfig --name {cluster.cluster_name} --region {region}",
                "Run this to point kubectl at the cluster",
            ),
            ("TrainingNamespace", config.training_namespace, "Namespace for TrainJobs"),
            ("RuntimeName", config.runtime_name, "ClusterTrainingRuntime to reference from TrainJobs"),
            ("FsxClaimName", self.training.pvc_name, f"PVC of the FSx file system (mounted at {FSX_MOUNT_PATH})"),
            ("ServiceAccountName", self.training.service_account_name, "Service account with S3 access"),
            (
                "EtcdEndpoints",
                ",".join(self.etcd.endpoints),
                "The jobs' 3-member etcd (namespace t5-etcd; reachable from training pods only)",
            ),
            ("EcrRepositoryUri", repo.repository_uri, "Push the training image here (make image)"),
            ("FsxFileSystemId", storage.lustre.file_system.file_system_id, "FSx for Lustre file system id"),
            ("FsxMountName", storage.lustre.file_system.mount_name, "FSx for Lustre mount name"),
            ("BucketName", storage.data.bucket.bucket_name, "S3 bucket for data and checkpoints"),
            ("GpuInstanceType", config.gpu_instance_type, "GPU instance type of the node group"),
            ("GpusPerNode", str(config.gpu.gpus), "GPUs per node (nproc per node)"),
            ("GpuNodes", str(config.gpu_nodes), "GPU nodes in the node group"),
        ):
            cdk.CfnOutput(self, name, value=value, description=desc)

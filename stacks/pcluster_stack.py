"""ParallelCluster deployment unit: a Slurm cluster with a GPU queue (EFA, placement group), FSx at /fsx, Pyxis/Enroot
pulling the training image from ECR, and the rendezvous store kept running on the head node."""
from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from cluster_assets.parallelcluster import node_setup
from cluster_assets.parallelcluster.config import build_cluster_config
from cluster_facts import FSX_MOUNT_PATH, GPU_QUEUE, RDZV_STORE_PORT, RDZV_STORE_UNIT
from stacks.components.parallelcluster import ClusterNodeAccess, ParallelClusterResource
from stacks.config import PCLUSTER_VERSION, InfraConfig
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack


class PclusterStack(cdk.Stack):
    """Head node + one Slurm GPU queue; jobs resume from checkpoints on /fsx after node failures."""

    def __init__(self, scope: Construct, construct_id: str, *, config: InfraConfig, network: NetworkStack,
                 storage: StorageStack, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        subnets = network.gpu_subnets
        fs = storage.lustre.file_system
        repository = storage.images.repository
        self.node_access = ClusterNodeAccess(
            self, "NodeAccess", vpc=network.vpc, repository=repository, store_port=RDZV_STORE_PORT,
            pyxis_enroot_script_path=str(node_setup.PYXIS_ENROOT_SCRIPT),
            rdzv_store_script_path=str(node_setup.RDZV_STORE_SCRIPT),
            node_base_script_path=str(node_setup.NODE_BASE_SCRIPT))
        access = self.node_access
        self.node_setup = node_setup.NodeSetup(
            script_bucket=access.pyxis_enroot_script.s3_bucket_name,
            pyxis_enroot_script_key=access.pyxis_enroot_script.s3_object_key,
            rdzv_store_script_key=access.rdzv_store_script.s3_object_key,
            node_base_script_key=access.node_base_script.s3_object_key,
            # The host part of EcrRepositoryUri: the storage stack shares this stack's account and region.
            ecr_registry=f"{cdk.Aws.ACCOUNT_ID}.dkr.ecr.{cdk.Aws.REGION}.{cdk.Aws.URL_SUFFIX}",
            region=cdk.Aws.REGION,
            store_port=RDZV_STORE_PORT, store_unit=RDZV_STORE_UNIT)
        self.cluster_configuration = build_cluster_config(
            head_node_instance_type=config.head_node_instance_type,
            head_node_subnet_id=subnets[0].subnet_id,
            # The first private subnet is the file system's AZ: no cross-AZ Lustre traffic.
            compute_subnet_ids=[s.subnet_id for s in subnets[:config.gpu_subnet_count]],
            gpu_instance_type=config.gpu_instance_type,
            compute_resource_name=config.gpu.compute_resource_name,
            max_nodes=config.gpu_nodes,
            fsx_file_system_id=fs.file_system_id,
            additional_security_group_ids=[storage.lustre.client_security_group.security_group_id],
            bucket_name=storage.data.bucket.bucket_name,
            efa=True,
            placement_group=config.placement_group,
            region=config.region,
            ssh_key_name=config.ssh_key_name,
            compute_root_gib=config.gpu_root_volume_gib,
            tags={"project": "t5-failover"},
            node_setup=self.node_setup,
            rdzv_store_security_group_id=access.store_security_group.security_group_id,
            compute_security_group_id=access.compute_security_group.security_group_id,
            node_iam_policy_arns=[access.ecr_pull_policy.managed_policy_arn],
            # Least privilege, as the EKS pods get: read the data, write only where Slurm jobs write.
            s3_read_prefixes=[config.data_prefix],
            s3_write_prefixes=list(config.job_prefixes),
            capacity_reservation_id=config.capacity_reservation_id,
            capacity_block=config.capacity_block,
        )
        self.pcluster = ParallelClusterResource(self, "ParallelCluster", cluster_name=config.cluster_name,
                                                pcluster_version=PCLUSTER_VERSION,
                                                cluster_configuration=self.cluster_configuration)
        head_instance = self.pcluster.attribute("headNode.instanceId")
        head_address = self.pcluster.attribute("headNode.privateIpAddress")
        for name, value, desc in (
            ("ClusterName", config.cluster_name, "ParallelCluster cluster name"),
            ("HeadNodeAddress", head_address, "Private IP of the head node (slurmctld, login)"),
            ("RdzvStoreEndpoint", f"{head_address}:{RDZV_STORE_PORT}",
             f"Rendezvous store on the head node (systemd {RDZV_STORE_UNIT}), reachable from the compute nodes"),
            ("HeadNodeInstanceId", head_instance, "Head node instance id"),
            ("HeadNodeSessionCommand", f"aws ssm start-session --target {head_instance} --region {cdk.Aws.REGION}",
             "Open a shell on the head node (no SSH key or public IP needed)"),
            ("SlurmPartition", GPU_QUEUE, "Slurm partition of the GPU nodes"),
            ("FsxMountDir", FSX_MOUNT_PATH, "Where FSx for Lustre is mounted on every node"),
            ("ValidationMessages", self.pcluster.attribute("validationMessages"),
             "ParallelCluster configuration warnings of the last create/update"),
            ("EcrRepositoryUri", repository.repository_uri, "ECR repository of the training image"),
            ("FsxFileSystemId", fs.file_system_id, "FSx for Lustre file system id"),
            ("FsxMountName", fs.mount_name, "FSx for Lustre mount name"),
            ("BucketName", storage.data.bucket.bucket_name, "S3 bucket for data and checkpoints"),
            ("GpuInstanceType", config.gpu_instance_type, "GPU instance type of the queue"),
            ("GpusPerNode", str(config.gpu.gpus), "GPUs per node"),
            ("GpuNodes", str(config.gpu_nodes), "Maximum GPU nodes in the queue"),
        ):
            cdk.CfnOutput(self, name, value=value, description=desc)

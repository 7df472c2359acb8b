"""ParallelCluster deployment unit: a Slurm cluster with a GPU queue (EFA, placement group), FSx at /fsx, Pyxis/Enroot
pulling the training image from ECR, and the jobs' coordinator: a three-member etcd on instances of its own."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from cluster_assets.parallelcluster import node_setup
from cluster_assets.parallelcluster.config import build_cluster_config
from cluster_facts import FSX_MOUNT_PATH, GPU_QUEUE
from stacks.components.etcd_members import EtcdMembers
from stacks.components.parallelcluster import ClusterNodeAccess, ParallelClusterResource
from stacks.config import PCLUSTER_VERSION, InfraConfig
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack


class PclusterStack(cdk.Stack):
    """Head node + one Slurm GPU queue; jobs resume from checkpoints on /fsx after node failures."""

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
        subnets = network.gpu_subnets
        fs = storage.lustre.file_system
        repository = storage.images.repository
        self.node_access = ClusterNodeAccess(
            self,
            "NodeAccess",
            vpc=network.vpc,
            repository=repository,
            pyxis_enroot_script_path=str(node_setup.PYXIS_ENROOT_SCRIPT),
            etcd_client_script_path=str(node_setup.ETCD_CLIENT_SCRIPT),
            node_base_script_path=str(node_setup.NODE_BASE_SCRIPT),
        )
        access = self.node_access
        # The coordinator: members in the private subnets in turn (the GPU nodes' AZ and the next), reachable from
        # the head node and the compute nodes only.
        self.etcd = EtcdMembers(
            self,
            "Etcd",
            vpc=network.vpc,
            subnets=network.gpu_subnets,
            client_security_groups=[access.head_node_security_group, access.compute_security_group],
        )
        self.node_setup = node_setup.NodeSetup(
            script_bucket=access.pyxis_enroot_script.s3_bucket_name,
            pyxis_enroot_script_key=access.pyxis_enroot_script.s3_object_key,
            etcd_client_script_key=access.etcd_client_script.s3_object_key,
            node_base_script_key=access.node_base_script.s3_object_key,
            # The host part of EcrRepositoryUri: the storage stack shares this stack's account and region.
            ecr_registry=f"{cdk.Aws.ACCOUNT_ID}.dkr.ecr.{cdk.Aws.REGION}.{cdk.Aws.URL_SUFFIX}",
            region=cdk.Aws.REGION,
            etcd_endpoints=self.etcd.endpoints,
            etcd_client_secret=self.etcd.client_secret.secret_arn,
            etcd_root_secret=self.etcd.root_secret.secret_arn,
        )
        self.cluster_configuration = build_cluster_config(
            head_node_instance_type=config.head_node_instance_type,
            head_node_subnet_id=subnets[0].subnet_id,
            # The first private subnet is the file system's AZ: no cross-AZ Lustre traffic.
            compute_subnet_ids=[s.subnet_id for s in subnets[: config.gpu_subnet_count]],
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
            head_node_security_group_id=access.head_node_security_group.security_group_id,
            compute_security_group_id=access.compute_security_group.security_group_id,
            node_iam_policy_arns=[access.ecr_pull_policy.managed_policy_arn],
            head_node_iam_policy_arns=[self.etcd.head_node_policy.managed_policy_arn],
            # Least privilege, as the EKS pods get: read the data, write only where Slurm jobs write.
            s3_read_prefixes=[config.data_prefix],
            s3_write_prefixes=list(config.job_prefixes),
            capacity_reservation_id=config.capacity_reservation_id,
            capacity_block=config.capacity_block,
        )
        self.pcluster = ParallelClusterResource(
            self,
            "ParallelCluster",
            cluster_name=config.cluster_name,
            pcluster_version=PCLUSTER_VERSION,
            cluster_configuration=self.cluster_configuration,
        )
        # The head node's setup waits for the members (their TLS material, a leader): start them first.
        for member in self.etcd.groups:
            self.pcluster.cluster.node.add_dependency(member)
        head_instance = self.pcluster.attribute("headNode.instanceId")
        head_address = self.pcluster.attribute("headNode.privateIpAddress")
        for name, value, desc in (
            ("ClusterName", config.cluster_name, "ParallelCluster cluster name"),
            ("HeadNodeAddress", head_address, "Private IP of the head node (slurmctld, login)"),
            (
                "EtcdEndpoints",
                self.etcd.endpoints,
                "etcd members of the jobs' coordinator (/etc/t5-failover/etcd.env on the head node names them too)",
            ),
            (
                "EtcdMemberGroups",
                cdk.Fn.join(",", [g.ref for g in self.etcd.groups]),
                "etcd members' Auto Scaling groups of one (their instance: aws autoscaling "
                "describe-auto-scaling-groups; aws ssm start-session --target <id>; systemctl status t5-etcd)",
            ),
            (
                "EtcdMemberSettings",
                self.etcd.settings.parameter_name,
                "SSM parameter the etcd members read at every boot (scripts, release, addresses, secrets' ARNs)",
            ),
            ("HeadNodeInstanceId", head_instance, "Head node instance id"),
            (
                "HeadNodeSessionCommand",
                f"aws ssm start-session --target {head_instance} --region {cdk.Aws.REGION}",
                "Open a shell on the head node (no SSH key or public IP needed)",
            ),
            ("SlurmPartition", GPU_QUEUE, "Slurm partition of the GPU nodes"),
            ("FsxMountDir", FSX_MOUNT_PATH, "Where FSx for Lustre is mounted on every node"),
            (
                "ValidationMessages",
                self.pcluster.attribute("validationMessages"),
                "ParallelCluster configuration warnings of the last create/update",
            ),
            ("EcrRepositoryUri", repository.repository_uri, "ECR repository of the training image"),
            ("FsxFileSystemId", fs.file_system_id, "FSx for Lustre file system id"),
            ("FsxMountName", fs.mount_name, "FSx for Lustre mount name"),
            ("BucketName", storage.data.bucket.bucket_name, "S3 bucket for data and checkpoints"),
            ("GpuInstanceType", config.gpu_instance_type, "GPU instance type of the queue"),
            ("GpusPerNode", str(config.gpu.gpus), "GPUs per node"),
            ("GpuNodes", str(config.gpu_nodes), "Maximum GPU nodes in the queue"),
        ):
            cdk.CfnOutput(self, name, value=value, description=desc)

"""FSx for Lustre (PERSISTENT_2, Lustre 2.15) linked to S3, with client/server security groups."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_s3 as s3
from constructs import Construct

#: Lustre network ports: 988 (LNet) and 1018-1023 (the file system's other services).
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
#: Every S3 change is mirrored both ways: data uploaded to S3 appears in /fsx; checkpoints written to /fsx
#: land in S3 (the durable tier: FSx backups are not available on S3-linked file systems).
AUTO_EVENTS = ["NEW", "CHANGED", "DELETED"]


class SharedLustre(Construct):
    """The shared training file system (mounted at /fsx on every node and pod).

    Attributes:
        file_system: the FSx file system (``file_system_id``, ``dns_name``, ``mount_name``).
        client_security_group: attach to every Lustre client (GPU nodes, head node); the file system
            admits it on the Lustre ports.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        bucket: s3.IBucket,
        s3_prefix: str,
        storage_capacity_gib: int,
        throughput_per_tib: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.server_security_group = ec2.SecurityGroup(
            self,
            "ServerSg",
            vpc=vpc,
            allow_all_outbound=True,
            description="FSx for Lustre file system: Lustre ports from its clients and itself",
        )
        self.client_security_group = ec2.SecurityGroup(
            self,
            "ClientSg",
            vpc=vpc,
            allow_all_outbound=True,
            description="Lustre clients (GPU nodes, head node): Lustre ports from the file system",
        )
        for port in LUSTRE_PORTS:
            # Clients call the servers and servers call back clients. (Server-to-server traffic: the L2 below
            # admits its own group on 988-1023.)
            self.server_security_group.add_ingress_rule(self.client_security_group, port, "Lustre from clients")
            self.client_security_group.add_ingress_rule(self.server_security_group, port, "Lustre from servers")

        self.file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnet=subnet,
            security_group=self.server_security_group,
            storage_capacity_gib=storage_capacity_gib,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
            ),
            # S3 is the durable tier (auto-export below). Retaining the file system would also keep its
            # security groups in use and make `cdk destroy` of this stack fail half-way.
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        # The L2 wrongly offers import_path for PERSISTENT_2; the supported link is a data repository
        # association (at most 8 per file system).
        self.s3_link = fsx.CfnDataRepositoryAssociation(
            self,
            "S3Link",
            file_system_id=self.file_system.file_system_id,
            file_system_path="/",
            data_repository_path=f"s3://{bucket.bucket_name}/{s3_prefix}",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=AUTO_EVENTS),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=AUTO_EVENTS),
            ),
        )

"""Storage deployment unit: S3 bucket, FSx for Lustre linked to it, ECR repository."""

from __future__ import annotations

from typing import Any, Optional

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.components.data_bucket import TrainingBucket
from stacks.components.image_repo import TrainingImageRepository
from stacks.components.lustre import SharedLustre


class StorageStack(cdk.Stack):
    """Everything that outlives a cluster: data and checkpoints (S3 + FSx) and the training image (ECR).

    Kept apart from the cluster stacks so a cluster can be torn down and rebuilt (or switched between EKS
    and ParallelCluster) without touching the data.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        fsx_subnet: ec2.ISubnet,
        existing_bucket_name: Optional[str],
        s3_prefix: str,
        fsx_storage_capacity_gib: int,
        fsx_throughput_per_tib: int,
        repository_name: str,
        export_prefix: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.data = TrainingBucket(self, "Bucket", existing_bucket_name=existing_bucket_name)
        self.lustre = SharedLustre(
            self,
            "Lustre",
            vpc=vpc,
            subnet=fsx_subnet,
            bucket=self.data.bucket,
            s3_prefix=s3_prefix,
            storage_capacity_gib=fsx_storage_capacity_gib,
            throughput_per_tib=fsx_throughput_per_tib,
        )
        self.images = TrainingImageRepository(self, "Images", repository_name=repository_name)

        # An explicitly named export: consumers build least-privilege ARNs from it, and cdk-nag findings on
        # those ARNs get a stable name (not a generated export id) to be acknowledged by.
        self.bucket_arn_export_name = f"{export_prefix}-data-bucket-arn"
        cdk.CfnOutput(
            self,
            "BucketArn",
            value=self.data.bucket.bucket_arn,
            export_name=self.bucket_arn_export_name,
            description="ARN of the data bucket",
        )
        fs = self.lustre.file_system
        for name, value, desc in (
            ("BucketName", self.data.bucket.bucket_name, "S3 bucket for data and checkpoints (durable tier)"),
            ("FsxFileSystemId", fs.file_system_id, "FSx for Lustre file system id"),
            ("FsxDnsName", fs.dns_name, "FSx for Lustre DNS name"),
            ("FsxMountName", fs.mount_name, "FSx for Lustre mount name (mount -t lustre DNS@tcp:/MOUNTNAME /fsx)"),
            ("EcrRepositoryUri", self.images.repository.repository_uri, "ECR repository for the training image"),
        ):
            cdk.CfnOutput(self, name, value=value, description=desc)

"""The S3 bucket for training data and checkpoints: created hardened, or an existing one imported."""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import acknowledge


class TrainingBucket(Construct):
    """Durable tier behind FSx: FSx auto-exports checkpoints here and imports training data from here.

    A created bucket is SSE-S3 encrypted (FSx data repository links need no KMS key policy then),
    SSL-only, versioned, with public access blocked and server access logs going to a sibling bucket.
    Both are retained on stack deletion: they hold the only durable copy of the checkpoints.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        existing_bucket_name: Optional[str],
        noncurrent_version_days: int = 30,
    ) -> None:
        super().__init__(scope, construct_id)
        self.created = existing_bucket_name is None
        if existing_bucket_name is not None:
            # Its encryption/SSL/versioning policy is the owner's responsibility (documented in docs/deploy.md).
            self.bucket: s3.IBucket = s3.Bucket.from_bucket_name(self, "Imported", existing_bucket_name)
            return
        access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(expiration=cdk.Duration.days(365), noncurrent_version_expiration=cdk.Duration.days(30))
            ],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        acknowledge(
            access_logs,
            "AwsSolutions-S1",
            "This is the server-access-log target of the data bucket; logging it into itself would "
            "create a feedback loop and a second log bucket would only move the problem.",
        )
        self.bucket = s3.Bucket(
            self,
            "Data",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=access_logs,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    # Checkpoints are rewritten often; old versions are only a short safety net.
                    noncurrent_version_expiration=cdk.Duration.days(noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(7),
                )
            ],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )

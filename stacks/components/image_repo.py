"""ECR repository for the training image."""
from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from constructs import Construct


class TrainingImageRepository(Construct):
    """Private ECR repository: scan on push, immutable tags (a tag always means the same bits, so a
    restarted job runs exactly the code it started with), and a lifecycle that bounds storage."""

    def __init__(self, scope: Construct, construct_id: str, *, repository_name: str, keep_images: int = 30) -> None:
        super().__init__(scope, construct_id)
        self.repository = ecr.Repository(
            self, "Repository",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.AES_256,
            lifecycle_rules=[
                ecr.LifecycleRule(rule_priority=1, description="drop untagged layers after a week",
                                  tag_status=ecr.TagStatus.UNTAGGED, max_image_age=cdk.Duration.days(7)),
                ecr.LifecycleRule(rule_priority=2, description=f"keep the newest {keep_images} images",
                                  tag_status=ecr.TagStatus.ANY, max_image_count=keep_images),
            ],
            # Images are cheap and rebuilding old ones is not: keep them when the stack is deleted.
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )

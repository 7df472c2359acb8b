"""ECR repository for the training image."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from constructs import Construct


class TrainingImageRepository(Construct):
    """Private ECR repository: scan on push, immutable tags (a tag always means the same bits, so a restarted job
    runs exactly the code it started with).

    No lifecycle rule expires images. ECR cannot see which image a running or requeued job will pull next, and
    every tag here is a content tag (``src-<digest>``) some job or checkout may still name; untagged manifests
    can be the per-platform children or attestations of a tagged image index, so even an "untagged" rule could
    break a tag in use. Old tags are deleted by hand (docs/deploy.md, "Training image"); storage is ~$0.10 per
    GB-month.

    Deleted with the stack, images included (``EmptyOnDelete``): a retained repository with this fixed name
    would make the next deploy of the storage stack fail ("already exists"). Every image is rebuilt from its
    checkout by ``make image`` (the tag is a digest of the build context).
    """

    def __init__(self, scope: Construct, construct_id: str, *, repository_name: str) -> None:
        super().__init__(scope, construct_id)
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.AES_256,
            empty_on_delete=True,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

"""Compose the stacks of one platform into a CDK app (used by app.py and by the tests)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import aws_cdk as cdk

from cluster_facts import image_repository
from stacks.config import InfraConfig
from stacks.nag import enable_aws_solutions_checks
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PlatformApp:
    """The app and its stacks, for tests and tooling."""

    app: cdk.App
    network: NetworkStack
    storage: StorageStack
    platform: cdk.Stack
    """The EKS or ParallelCluster stack."""


def cdk_json_context() -> dict[str, Any]:
    """The ``context`` block of cdk.json (feature flags and defaults), minus the ``//`` documentation."""
    ctx = json.loads((ROOT / "cdk.json").read_text())["context"]
    return {k: v for k, v in ctx.items() if not k.startswith("//")}


def new_app(overrides: Optional[dict[str, Any]] = None, *, outdir: Optional[Union[str, Path]] = None) -> cdk.App:
    """An App with the same context ``cdk synth`` would see (cdk.json) plus ``overrides`` (like ``-c``)."""
    return cdk.App(
        context=cdk_json_context() | dict(overrides or {}), outdir=str(outdir) if outdir is not None else None
    )


def build_stacks(app: cdk.App, config: InfraConfig, *, nag: bool = True) -> PlatformApp:
    """Add the network, storage and platform stacks for ``config`` to ``app``.

    ``nag`` adds the cdk-nag AwsSolutions checks: synthesis then fails on any unacknowledged finding.
    """
    env = cdk.Environment(account=config.account, region=config.region) if (config.account or config.region) else None
    tags = {"project": "t5-failover", "prefix": config.name_prefix}

    network = NetworkStack(
        app,
        "Network",
        stack_name=config.stack_name("network"),
        env=env,
        description="t5-failover: VPC, NAT, flow logs, S3/ECR/STS endpoints",
        cidr=config.vpc_cidr,
        max_azs=config.max_azs,
        availability_zones=config.availability_zones,
        nat_gateways=config.nat_gateways,
    )
    storage = StorageStack(
        app,
        "Storage",
        stack_name=config.stack_name("storage"),
        env=env,
        description="t5-failover: S3 bucket, FSx for Lustre linked to S3, ECR repository",
        vpc=network.vpc,
        fsx_subnet=network.gpu_subnets[0],
        existing_bucket_name=config.bucket_name,
        s3_prefix=config.s3_prefix,
        fsx_storage_capacity_gib=config.fsx_storage_capacity_gib,
        fsx_throughput_per_tib=config.fsx_throughput_per_tib,
        repository_name=image_repository(config.name_prefix),
        export_prefix=config.name_prefix,
    )
    if config.platform == "eks":
        from stacks.eks_stack import EksStack  # noqa: PLC0415 - only load what the platform needs

        platform: cdk.Stack = EksStack(
            app,
            "Eks",
            stack_name=config.stack_name("eks"),
            env=env,
            description="t5-failover: EKS GPU cluster with Kubeflow Trainer",
            config=config,
            network=network,
            storage=storage,
        )
    else:
        from stacks.pcluster_stack import PclusterStack  # noqa: PLC0415

        platform = PclusterStack(
            app,
            "ParallelCluster",
            stack_name=config.stack_name("pcluster"),
            env=env,
            description="t5-failover: AWS ParallelCluster Slurm GPU cluster",
            config=config,
            network=network,
            storage=storage,
        )
    for stack in (network, storage, platform):
        for key, value in tags.items():
            cdk.Tags.of(stack).add(key, value)
    if nag:
        enable_aws_solutions_checks(app)
    return PlatformApp(app=app, network=network, storage=storage, platform=platform)

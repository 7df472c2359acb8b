"""Network deployment unit: the VPC every other stack uses."""

from __future__ import annotations

from typing import Any, Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.components.network import TrainingNetwork


class NetworkStack(cdk.Stack):
    """VPC, NAT, flow logs and VPC endpoints (see :class:`TrainingNetwork`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cidr: str,
        max_azs: int,
        availability_zones: Sequence[str],
        nat_gateways: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self._explicit_azs = list(availability_zones)
        self.network = TrainingNetwork(
            self,
            "Network",
            cidr=cidr,
            max_azs=max_azs,
            availability_zones=availability_zones,
            nat_gateways=nat_gateways,
        )
        cdk.CfnOutput(self, "VpcId", value=self.vpc.vpc_id, description="VPC of the training platform")

    @property
    def availability_zones(self) -> list[str]:
        """Explicit AZs win over the context lookup that a stack with account/region would otherwise need
        (ec2.Vpc consults this even when given availability_zones), so such stacks still synth offline."""
        return self._explicit_azs or super().availability_zones

    @property
    def vpc(self) -> ec2.IVpc:
        return self.network.vpc

    @property
    def gpu_subnets(self) -> list[ec2.ISubnet]:
        """Private subnets in AZ order; the first one hosts the file system and (by default) the GPU nodes."""
        return self.network.private_subnets

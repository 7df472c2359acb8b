"""Network deployment unit: the VPC every other stack uses."""
from __future__ import annotations

from typing import Any, Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.components.network import TrainingNetwork


class NetworkStack(cdk.Stack):
    """VPC, NAT, flow logs and VPC endpoints (see :class:`TrainingNetwork`)."""

    def __init__(self, scope: Construct, construct_id: str, *, cidr: str, max_azs: int,
                 availability_zones: Sequence[str], nat_gateways: int, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.network = TrainingNetwork(self, "Network", cidr=cidr, max_azs=max_azs,
                                       availability_zones=availability_zones, nat_gateways=nat_gateways)
        cdk.CfnOutput(self, "VpcId", value=self.vpc.vpc_id, description="VPC of the training platform")

    @property
    def vpc(self) -> ec2.IVpc:
        return self.network.vpc

    @property
    def gpu_subnets(self) -> list[ec2.ISubnet]:
        """Private subnets in AZ order; the first one hosts the file system and (by default) the GPU nodes."""
        return self.network.private_subnets

"""VPC for GPU training: private subnets with NAT, flow logs, and the VPC endpoints image pulls need."""

from __future__ import annotations

from typing import Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct


class TrainingNetwork(Construct):
    """VPC with one public (NAT only) and one large private subnet per AZ.

    Nodes live in the private subnets. The S3 gateway endpoint keeps image layers and training data off
    the NAT gateway (cheaper, faster); the ECR and STS interface endpoints let nodes pull images and pods
    get credentials even if NAT is down.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cidr: str,
        max_azs: int,
        availability_zones: Sequence[str],
        nat_gateways: int,
        flow_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, construct_id)
        prefix = int(cidr.split("/")[1])
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            # Explicit AZs pin the GPU AZ; otherwise the first max_azs of the region.
            availability_zones=list(availability_zones) or None,
            max_azs=None if availability_zones else max_azs,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=min(prefix + 8, 28)
                ),
                # The VPC CNI gives every pod a VPC IP: private subnets get a quarter of the VPC each.
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=prefix + 2
                ),
            ],
            # Nothing uses the default security group; restricting it would add a custom-resource Lambda.
            restrict_default_security_group=False,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        log_group = logs.LogGroup(
            self, "FlowLogs", retention=flow_log_retention, removal_policy=cdk.RemovalPolicy.DESTROY
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        # One explicit security group admitting HTTPS from the VPC's literal CIDR (the default per-endpoint
        # groups reference the CIDR through Fn::GetAtt, which cdk-nag cannot evaluate).
        endpoint_sg = ec2.SecurityGroup(
            self,
            "EndpointSg",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Interface endpoints: HTTPS from inside the VPC",
        )
        endpoint_sg.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        for name, service in (
            ("EcrApi", ec2.InterfaceVpcEndpointAwsService.ECR),
            ("EcrDocker", ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER),
            ("Sts", ec2.InterfaceVpcEndpointAwsService.STS),
        ):
            self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=private,
                private_dns_enabled=True,
                security_groups=[endpoint_sg],
                open=False,
            )

    @property
    def private_subnets(self) -> list[ec2.ISubnet]:
        """Private subnets in AZ order; index 0 hosts the GPU nodes and the file system."""
        return list(self.vpc.private_subnets)

"""Launch template for GPU nodes: EFA on every network card, cluster placement group, IMDSv2, encrypted EBS."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from cluster_facts import GpuInstanceSpec


def efa_network_interfaces(
    spec: GpuInstanceSpec, security_group_ids: Sequence[str]
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """One EFA interface per network card: card 0 is ``efa`` (EFA + the node's IP), the others ``efa-only``
    (RDMA only, no IP address consumed). Security groups must be listed on every interface because a
    launch template with interfaces cannot also set instance-level groups."""
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            network_card_index=card,
            # AWS's multi-card layout: the primary interface is device 0, every further card's is device 1.
            device_index=0 if card == 0 else 1,
            interface_type="efa" if card == 0 else "efa-only",
            groups=list(security_group_ids),
            delete_on_termination=True,
        )
        for card in range(spec.efa_interfaces)
    ]


def capacity_reservation_data(capacity_reservation_id: Optional[str], capacity_block: bool) -> dict[str, Any]:
    """Launch-template data that launches into one reservation: an On-Demand Capacity Reservation, or a Capacity
    Block for ML (which also needs the ``capacity-block`` market type). Empty without a reservation."""
    if not capacity_reservation_id:
        return {}
    data: dict[str, Any] = {
        "capacity_reservation_specification": ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
            capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                capacity_reservation_id=capacity_reservation_id
            )
        )
    }
    if capacity_block:
        data["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
            market_type="capacity-block"
        )
    return data


class GpuLaunchTemplate(Construct):
    """Launch template (and optional CLUSTER placement group) for one GPU instance type.

    The instance type lives here rather than in the node group: aws-cdk-lib's GPU list lacks the p5
    family and rejects ``p5.48xlarge`` with the NVIDIA AMI type at synth (without an AMI type a p5 would
    silently get the non-NVIDIA AMI).

    Attributes:
        launch_template: the ``AWS::EC2::LaunchTemplate``.
        placement_group: the ``AWS::EC2::PlacementGroup`` or None.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: GpuInstanceSpec,
        security_group_ids: Sequence[str],
        placement_group: bool,
        root_volume_gib: int,
        name_tag: Optional[str] = None,
        capacity_reservation_id: Optional[str] = None,
        capacity_block: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        if capacity_block and not capacity_reservation_id:
            raise ValueError("capacity_block=True needs the Capacity Block's capacity_reservation_id (cr-...)")
        if capacity_reservation_id and placement_group:
            raise ValueError(
                "a capacity reservation carries its own placement: pass placement_group=False with "
                "capacity_reservation_id"
            )
        if not security_group_ids:
            raise ValueError(
                "security_group_ids: list at least the EKS cluster security group; interfaces "
                "without it cannot reach the control plane or each other"
            )
        self.placement_group: Optional[ec2.PlacementGroup] = None
        if placement_group:
            # All nodes on the same spine: lowest latency and full bisection bandwidth for NCCL over EFA.
            self.placement_group = ec2.PlacementGroup(
                self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
            )
        tags = (
            [
                ec2.CfnLaunchTemplate.TagSpecificationProperty(
                    resource_type="instance", tags=[{"key": "Name", "value": name_tag}]
                )
            ]
            if name_tag
            else None
        )
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                instance_type=spec.instance_type,
                placement=ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.placement_group_name)
                if self.placement_group
                else None,
                network_interfaces=efa_network_interfaces(spec, security_group_ids),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name="/dev/xvda",
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=root_volume_gib,
                            volume_type="gp3",
                            encrypted=True,
                            delete_on_termination=True,
                            iops=6000,
                            throughput=500,
                        ),
                    )
                ],
                # IMDSv2 only; hop limit 1 keeps pods (which use EKS Pod Identity) away from the node role.
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
                ),
                tag_specifications=tags,
                **capacity_reservation_data(capacity_reservation_id, capacity_block),
            ),
        )

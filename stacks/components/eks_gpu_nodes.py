"""The GPU managed node group: launch template with EFA + placement group, NVIDIA AMI, GPU taint."""

from __future__ import annotations

import datetime
from typing import Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from cluster_facts import GPU_TAINT_KEY, GpuInstanceSpec
from cluster_facts.names import GPU_POOL, NODE_POOL_LABEL
from stacks.components.gpu_launch_template import GpuLaunchTemplate
from stacks.capacity_block import capacity_block_sizes

GPU_POOL_LABEL = {NODE_POOL_LABEL: GPU_POOL}
#: The NVIDIA device plugin chart's default node affinity selects nodes carrying this label.
NVIDIA_PRESENT_LABEL = {"nvidia.com/gpu.present": "true"}


class GpuNodeGroup(Construct):
    """Fixed-size GPU node group. Node auto-repair replaces unhealthy GPU nodes; the training job's
    JobSet restart policy then resumes on the replacement from the last checkpoint.

    With a Capacity Block the size follows the block (:func:`capacity_block_sizes`): 0 to ``node_count``, set by
    two one-time EventBridge Scheduler schedules that call ``eks:UpdateNodegroupConfig`` at the block's start and
    before its end (their role may do that on this node group only).

    Attributes:
        nodegroup: the ``eks.Nodegroup``.
        launch_template: the :class:`GpuLaunchTemplate` it uses.
        schedules: the Capacity Block's scaling schedules (empty without one).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        spec: GpuInstanceSpec,
        node_count: int,
        subnets: Sequence[ec2.ISubnet],
        placement_group: bool,
        extra_security_group_ids: Sequence[str],
        root_volume_gib: int,
        name_tag: str,
        capacity_reservation_id: Optional[str] = None,
        capacity_block: bool = False,
        capacity_block_window: Optional[tuple[datetime.datetime, datetime.datetime]] = None,
        now: Optional[datetime.datetime] = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if node_count < 1:
            raise ValueError(f"node_count={node_count}: a GPU node group needs at least 1 node")
        if placement_group and len(subnets) != 1:
            raise ValueError(
                f"{len(subnets)} subnets given with a CLUSTER placement group: it lives in one AZ, "
                "pass exactly one subnet or disable the placement group"
            )
        self.launch_template = GpuLaunchTemplate(
            self,
            "Template",
            spec=spec,
            placement_group=placement_group,
            root_volume_gib=root_volume_gib,
            # Listing interfaces replaces the groups EKS would add, so the cluster group is named explicitly.
            security_group_ids=[cluster.cluster_security_group_id, *extra_security_group_ids],
            name_tag=name_tag,
            capacity_reservation_id=capacity_reservation_id,
            capacity_block=capacity_block,
        )
        lt = self.launch_template.launch_template
        min_size = desired = node_count
        steps: list[tuple[str, datetime.datetime, int]] = []
        if capacity_block:
            now = now or datetime.datetime.now(datetime.timezone.utc)
            min_size = 0
            desired, steps = capacity_block_sizes(node_count, capacity_block_window, now)
        self.nodegroup = cluster.add_nodegroup_capacity(
            "GpuNodes",
            launch_template_spec=eks.LaunchTemplateSpec(id=lt.ref, version=lt.attr_latest_version_number),
            # Explicit: without ami_type a p5 would silently get the non-NVIDIA AMI.
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            # A Capacity Block needs its own capacity type; an On-Demand Capacity Reservation is on-demand capacity
            # that the launch template targets.
            capacity_type=eks.CapacityType.CAPACITY_BLOCK if capacity_block else eks.CapacityType.ON_DEMAND,
            min_size=min_size,
            desired_size=desired,
            max_size=node_count,
            max_unavailable=1,
            subnets=ec2.SubnetSelection(subnets=list(subnets)),
            labels=GPU_POOL_LABEL | NVIDIA_PRESENT_LABEL,
            taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value="true")],
            enable_node_auto_repair=True,
        )
        self.schedules = self._schedules(cluster, node_count, steps) if steps else []

    def _schedules(
        self, cluster: eks.Cluster, node_count: int, steps: list[tuple[str, datetime.datetime, int]]
    ) -> list[scheduler.CfnSchedule]:
        role = iam.Role(
            self,
            "CapacityBlockScalingRole",
            assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
            description="EventBridge Scheduler: scale the GPU node group with its Capacity Block",
        )
        role.add_to_policy(
            iam.PolicyStatement(actions=["eks:UpdateNodegroupConfig"], resources=[self.nodegroup.nodegroup_arn])
        )
        nodegroup = self.nodegroup.node.default_child
        schedules = []
        for name, when, size in steps:
            request = {
                "clusterName": cluster.cluster_name,
                # the name itself (GetAtt): the node group's Ref is "<cluster>/<name>" (aws/aws-cdk#22442)
                "nodegroupName": nodegroup.attr_nodegroup_name,
                "scalingConfig": {"minSize": 0, "maxSize": node_count, "desiredSize": size},
            }
            schedules.append(
                scheduler.CfnSchedule(
                    self,
                    name,
                    description=f"Capacity Block: GPU node group to {size} node(s)",
                    schedule_expression=f"at({when.strftime('%Y-%m-%dT%H:%M:%S')})",
                    schedule_expression_timezone="UTC",
                    flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
                    target=scheduler.CfnSchedule.TargetProperty(
                        arn=f"arn:{cdk.Aws.PARTITION}:scheduler:::aws-sdk:eks:updateNodegroupConfig",
                        role_arn=role.role_arn,
                        input=cdk.Stack.of(self).to_json_string(request),
                        retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                            maximum_event_age_in_seconds=3600, maximum_retry_attempts=20
                        ),
                    ),
                )
            )
        return schedules

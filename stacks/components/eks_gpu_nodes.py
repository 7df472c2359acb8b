"""The GPU managed node group: launch template with EFA + placement group, NVIDIA AMI, GPU taint."""

from __future__ import annotations

from typing import Optional, Sequence

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cluster_facts import GPU_TAINT_KEY, GpuInstanceSpec
from cluster_facts.names import GPU_POOL, NODE_POOL_LABEL
from stacks.components.gpu_launch_template import GpuLaunchTemplate

GPU_POOL_LABEL = {NODE_POOL_LABEL: GPU_POOL}
#: The NVIDIA device plugin chart's default node affinity selects nodes carrying this label.
NVIDIA_PRESENT_LABEL = {"nvidia.com/gpu.present": "true"}


class GpuNodeGroup(Construct):
    """Fixed-size GPU node group. Node auto-repair replaces unhealthy GPU nodes; the training job's
    JobSet restart policy then resumes on the replacement from the last checkpoint.

    Attributes:
        nodegroup: the ``eks.Nodegroup``.
        launch_template: the :class:`GpuLaunchTemplate` it uses.
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
        self.nodegroup = cluster.add_nodegroup_capacity(
            "GpuNodes",
            launch_template_spec=eks.LaunchTemplateSpec(id=lt.ref, version=lt.attr_latest_version_number),
            # Explicit: without ami_type a p5 would silently get the non-NVIDIA AMI.
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            # A Capacity Block needs its own capacity type; an On-Demand Capacity Reservation is on-demand capacity
            # that the launch template targets.
            capacity_type=eks.CapacityType.CAPACITY_BLOCK if capacity_block else eks.CapacityType.ON_DEMAND,
            min_size=node_count,
            desired_size=node_count,
            max_size=node_count,
            max_unavailable=1,
            subnets=ec2.SubnetSelection(subnets=list(subnets)),
            labels=GPU_POOL_LABEL | NVIDIA_PRESENT_LABEL,
            taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value="true")],
            enable_node_auto_repair=True,
        )

"""An EKS etcd member whose node is lost comes back in its own AZ (issue #53 item 3): the system nodes are one
managed node group per AZ, each of at least one node, so a lost or updated node is replaced (and an update surges)
in the AZ that holds the member's zonal volume; one group over both AZs could bring the replacement up in the other
AZ, leaving the member Pending and its PodDisruptionBudget stalling the next node's drain."""

from __future__ import annotations

import json

from cluster_assets.k8s import etcd
from tests.support.infra import Synthesized, resources_of_type


def test_one_system_node_group_per_az_each_with_a_node(eks: Synthesized) -> None:
    groups = [
        r["Properties"]
        for _, r in resources_of_type(eks.templates["Eks"], "AWS::EKS::Nodegroup")
        if r["Properties"]["AmiType"] == "AL2023_x86_64_STANDARD"
    ]
    assert len(groups) == 2  # the two AZs of the cluster's subnets
    subnets = [json.dumps(g["Subnets"]) for g in groups]
    assert all(len(g["Subnets"]) == 1 for g in groups) and len(set(subnets)) == 2  # one AZ each, both covered
    sizes = sorted(
        (g["ScalingConfig"]["MinSize"], g["ScalingConfig"]["DesiredSize"], g["ScalingConfig"]["MaxSize"])
        for g in groups
    )
    assert sizes == [(1, 1, 2), (2, 2, 3)]  # 3 nodes in all, one per member; a node never leaves its AZ's group
    assert all(g["NodeRepairConfig"] == {"Enabled": True} for g in groups)
    # what the groups are for: a member per node on a volume that stays in its AZ
    members = etcd.cluster_objects(admin_image="img", training_namespace="t", node_selector={})["members"]
    (statefulset,) = [o for o in members if o["kind"] == "StatefulSet"]
    assert statefulset["spec"]["replicas"] == sum(s[0] for s in sizes)

"""AWS ParallelCluster as a CloudFormation custom resource (``Custom::PclusterCluster``)."""
from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from stacks import versions


class ParallelClusterResource(Construct):
    """The ParallelCluster provider (a nested stack hosted by AWS) and one cluster created through it.

    The provider's Lambda runs ``pcluster create/update/delete-cluster`` for the ``Custom::PclusterCluster``
    resource, so the cluster's lifecycle follows this stack's. The configuration is the dict produced by
    :func:`cluster_assets.parallelcluster.config.build_cluster_config` (CloudFormation tokens allowed).

    Attributes:
        provider: the ``AWS::CloudFormation::Stack`` of the provider.
        cluster: the custom resource; ``get_att_string("headNode.privateIpAddress")`` etc.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str, pcluster_version: str,
                 cluster_configuration: dict[str, Any]) -> None:
        super().__init__(scope, construct_id)
        template_url = versions.PCLUSTER_PROVIDER_TEMPLATE.replace("{version}", pcluster_version)
        self.provider = cdk.CfnStack(self, "Provider", template_url=cdk.Fn.sub(template_url))
        self.cluster = cdk.CustomResource(
            self, "Cluster",
            resource_type="Custom::PclusterCluster",
            service_token=self.provider.get_att("Outputs.ServiceToken").to_string(),
            properties={"ClusterName": cluster_name, "ClusterConfiguration": cluster_configuration},
        )

    def attribute(self, name: str) -> str:
        """A ``Fn::GetAtt`` of the cluster (``pcluster describe-cluster`` fields, dotted)."""
        return self.cluster.get_att_string(name)

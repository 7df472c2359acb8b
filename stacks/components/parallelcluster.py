"""AWS ParallelCluster as a CloudFormation custom resource (``Custom::PclusterCluster``), and the security groups,
IAM policy and node scripts its nodes use."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from stacks import versions
from stacks.nag import acknowledge


class ParallelClusterResource(Construct):
    """The ParallelCluster provider (a nested stack hosted by AWS) and one cluster created through it.

    The provider's Lambda runs ``pcluster create/update/delete-cluster`` for the ``Custom::PclusterCluster``
    resource, so the cluster's lifecycle follows this stack's. The configuration is the dict produced by
    :func:`cluster_assets.parallelcluster.config.build_cluster_config` (CloudFormation tokens allowed).

    Attributes:
        provider: the ``AWS::CloudFormation::Stack`` of the provider.
        cluster: the custom resource; ``get_att_string("headNode.privateIpAddress")`` etc.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        pcluster_version: str,
        cluster_configuration: dict[str, Any],
    ) -> None:
        super().__init__(scope, construct_id)
        template_url = versions.PCLUSTER_PROVIDER_TEMPLATE.replace("{version}", pcluster_version)
        self.provider = cdk.CfnStack(self, "Provider", template_url=cdk.Fn.sub(template_url))
        self.cluster = cdk.CustomResource(
            self,
            "Cluster",
            resource_type="Custom::PclusterCluster",
            service_token=self.provider.get_att("Outputs.ServiceToken").to_string(),
            properties={"ClusterName": cluster_name, "ClusterConfiguration": cluster_configuration},
        )

    def attribute(self, name: str) -> str:
        """A ``Fn::GetAtt`` of the cluster (``pcluster describe-cluster`` fields, dotted)."""
        return self.cluster.get_att_string(name)


class ClusterNodeAccess(Construct):
    """What the cluster's nodes need beyond ParallelCluster's own resources: security groups that name them for the
    etcd members, ECR pull rights and the node scripts.

    * ``head_node_security_group`` / ``compute_security_group``: added to the head node / the GPU queue's nodes; no
      rules of their own, they only name the nodes as sources the etcd members' group admits
      (:class:`stacks.components.etcd_members.EtcdMembers`). Neither needs egress rules: ParallelCluster's own
      node groups allow all outbound traffic, and replies to admitted connections pass a security group anyway.
    * ``ecr_pull_policy``: managed policy under the IAM path ``/parallelcluster/`` (the ParallelCluster provider
      may attach only such policies to the node roles): ``ecr:GetAuthorizationToken`` (account-wide by AWS's
      design) and image reads on ``repository`` only.
    * ``node_base_script`` / ``pyxis_enroot_script`` / ``etcd_client_script``: the node scripts as S3 assets (CDK's
      asset bucket).

    Attributes:
        head_node_security_group, compute_security_group, ecr_pull_policy, node_base_script, pyxis_enroot_script,
        etcd_client_script.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        repository: ecr.IRepository,
        pyxis_enroot_script_path: str,
        etcd_client_script_path: str,
        node_base_script_path: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.compute_security_group = ec2.SecurityGroup(
            self,
            "ComputeNodeSg",
            vpc=vpc,
            allow_all_outbound=False,
            description="ParallelCluster GPU compute nodes: a source the etcd members admit on the client port",
        )
        self.head_node_security_group = ec2.SecurityGroup(
            self,
            "HeadNodeSg",
            vpc=vpc,
            allow_all_outbound=False,
            description="ParallelCluster head node: a source the etcd members admit on the client port",
        )

        self.ecr_pull_policy = iam.ManagedPolicy(
            self,
            "EcrPullPolicy",
            path="/parallelcluster/",
            description="ParallelCluster nodes: pull the training image (Enroot/Pyxis) from its ECR repository only",
            statements=[
                iam.PolicyStatement(sid="EcrToken", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
                iam.PolicyStatement(
                    sid="EcrPullTrainingImage",
                    actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                    resources=[repository.repository_arn],
                ),
            ],
        )
        acknowledge(
            self.ecr_pull_policy,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions (AWS requires Resource '*'); the "
            "token alone reads nothing: image reads are limited to the training repository's ARN",
        )

        self.node_base_script = s3_assets.Asset(self, "NodeBaseScript", path=node_base_script_path)
        self.pyxis_enroot_script = s3_assets.Asset(self, "PyxisEnrootScript", path=pyxis_enroot_script_path)
        self.etcd_client_script = s3_assets.Asset(self, "EtcdClientScript", path=etcd_client_script_path)

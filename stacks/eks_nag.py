"""cdk-nag acknowledgements for resources that aws_eks_v2 creates internally (one reason per finding)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from constructs import IConstruct

from stacks.nag import acknowledge


def managed_policy_finding(name: str) -> str:
    """cdk-nag's id for an AWS managed policy attached to a role."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


NODE_POLICIES = {
    "AmazonEKSWorkerNodePolicy": "EKS managed node groups require it: nodes register with and describe the cluster.",
    "AmazonEKS_CNI_Policy": "The VPC CNI (aws-node) on each node assigns pod IPs through ENIs with this AWS-maintained "
    "policy; it tracks new EC2 networking APIs that a hand-written copy would miss.",
    "AmazonEC2ContainerRegistryReadOnly": "Nodes pull the training image and EKS add-on images from ECR; the "
    "AWS policy is read-only and covers the regional EKS add-on registries.",
}


def acknowledge_nodegroup(nodegroup: eks.Nodegroup) -> None:
    """The three AWS managed policies every EKS managed node group role carries."""
    for policy, reason in NODE_POLICIES.items():
        acknowledge(nodegroup.role, managed_policy_finding(policy), f"{reason} (node group role)")


def _logical_id(construct: IConstruct) -> str:
    """Logical id of a construct's CloudFormation resource, as cdk-nag prints it."""
    cfn = construct.node.default_child
    assert isinstance(cfn, cdk.CfnElement), construct.node.path
    return str(cdk.Stack.of(cfn).resolve(cfn.logical_id))


def acknowledge_cluster(cluster: eks.Cluster) -> None:
    """Cluster service role and the kubectl/Helm custom-resource provider created by aws_eks_v2."""
    acknowledge(
        cluster.role,
        managed_policy_finding("AmazonEKSClusterPolicy"),
        "The EKS service role must carry AmazonEKSClusterPolicy; EKS documents no narrower alternative.",
    )
    provider = cluster.kubectl_provider
    assert provider is not None, "cluster has no kubectl provider"
    handler = provider.node.find_child("Handler")
    for policy in ("service-role/AWSLambdaBasicExecutionRole", "service-role/AWSLambdaVPCAccessExecutionRole"):
        acknowledge(
            provider,
            managed_policy_finding(policy),
            "Execution role of the aws_eks_v2 kubectl/Helm provider Lambdas (CloudWatch logs, ENIs in the "
            "private subnets); created by aws-cdk-lib, not configurable.",
        )
    acknowledge(
        provider,
        managed_policy_finding("AmazonEC2ContainerRegistryReadOnly"),
        "The kubectl provider pulls Helm charts from private ECR (oci://) with this read-only policy; "
        "added by aws-cdk-lib for OCI chart support.",
    )
    (has_ecr_public,) = [
        c for c in provider.node.find_all() if isinstance(c, cdk.CfnCondition) and c.node.id == "HasEcrPublic"
    ]
    condition_id = str(cdk.Stack.of(provider).resolve(has_ecr_public.logical_id))
    ecr_public = (
        'AwsSolutions-IAM4[Policy::{"Fn::If":["'
        + condition_id
        + '",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/'
        'AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]'
    )
    acknowledge(
        provider,
        ecr_public,
        "Read-only ECR Public access for the kubectl provider's oci:// chart pulls, attached by "
        "aws-cdk-lib only in partitions that have ECR Public.",
    )
    acknowledge(
        handler,
        "AwsSolutions-L1",
        "The kubectl provider Lambda's runtime is pinned by aws-cdk-lib to match the kubectl layer; "
        "it moves with aws-cdk-lib upgrades.",
    )
    acknowledge(
        provider,
        f"AwsSolutions-IAM5[Resource::<{_logical_id(handler)}.Arn>:*]",
        "The custom-resource framework invokes the kubectl handler function and its versions "
        "(<arn>:*); scoped to that one function.",
    )


def acknowledge_eks_findings(stack: cdk.Stack, *, cluster: eks.Cluster, nodegroups: list[eks.Nodegroup]) -> None:
    """Acknowledge the aws_eks_v2-internal findings of ``stack``."""
    acknowledge_cluster(cluster)
    for ng in nodegroups:
        acknowledge_nodegroup(ng)
    del stack  # acknowledgements sit on the constructs themselves, never stack-wide

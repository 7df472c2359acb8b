"""EKS control plane (aws_eks_v2), system node group and the managed add-ons the training needs."""

from __future__ import annotations

from typing import Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from cluster_facts.names import NODE_POOL_LABEL, SYSTEM_POOL

SYSTEM_POOL_LABEL = {NODE_POOL_LABEL: SYSTEM_POOL}


def control_plane_log_group(cluster_name: str) -> str:
    """The CloudWatch log group EKS writes a cluster's control-plane logs to (a fixed name, chosen by EKS)."""
    return f"/aws/eks/{cluster_name}/cluster"


def handler_log_group_prefix(cluster_name: str) -> str:
    """Prefix of the log groups of the kubectl handler's Lambda functions (``<prefix>handler``, ...)."""
    return f"/aws/lambda/{cluster_name}-kubectl-"


#: Lambda log group retention of the stack's own functions (the kubectl handler and its provider).
HANDLER_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


def log_group_key(scope: Construct, construct_id: str, log_group_names: Sequence[str], what: str) -> kms.Key:
    """A rotated KMS key that CloudWatch Logs may use for the log groups ``log_group_names`` only (names or
    ``prefix-*`` patterns, matched against the encryption context's log group ARN); the account keeps administering
    it through IAM (the key policy's default)."""
    stack = cdk.Stack.of(scope)
    key = kms.Key(
        scope,
        construct_id,
        enable_key_rotation=True,
        description=f"{what}: encryption of the log groups {', '.join(log_group_names)}",
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="CloudWatchLogsForTheseLogGroupsOnly",
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.{stack.url_suffix}")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={
                "ArnLike": {
                    "kms:EncryptionContext:aws:logs:arn": [
                        stack.format_arn(
                            service="logs",
                            resource="log-group",
                            resource_name=name,
                            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                        )
                        for name in log_group_names
                    ]
                }
            },
        )
    )
    return key


class TrainingEksCluster(Construct):
    """EKS cluster with a private-subnet system node group, Pod Identity, the FSx CSI driver and the VPC CNI
    (network policies enforced).

    ``aws_eks_v2`` gives a native ``AWS::EKS::Cluster`` with access entries and no nested stacks. Its
    default capacity (Auto Mode) is turned off: GPU capacity is a managed node group we fully control.

    Attributes:
        cluster: the ``eks.Cluster``.
        system_nodegroups: the system node groups, one per AZ (Trainer controller, CoreDNS, CSI controllers and
            the jobs' 3 etcd members, one per node, run here); system_nodes: their parent construct (what other
            constructs depend on).
        vpc_cni: the managed ``vpc-cni`` add-on (``enableNetworkPolicy``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        kubernetes_version: str,
        vpc: ec2.IVpc,
        subnets: Sequence[ec2.ISubnet],
        system_instance_type: str,
        api_allowed_cidrs: Sequence[str],
        admin_principal_arn: Optional[str],
        system_nodes: int = 3,
    ) -> None:
        super().__init__(scope, construct_id)
        if api_allowed_cidrs:
            endpoint = eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*api_allowed_cidrs)
        else:
            endpoint = eks.EndpointAccess.PRIVATE
        secrets_key = kms.Key(
            self,
            "SecretsKey",
            enable_key_rotation=True,
            description=f"{cluster_name}: envelope encryption of Kubernetes secrets",
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        # EKS writes the control-plane logs to this group and would create it itself, outside the stack, where it
        # outlives a destroy (and bills storage forever). Created here first, with a retention, and deleted with it.
        # The audit log names every caller and object, the kubectl handler's the manifests it applies: encrypted with
        # a key of the stack's own, for these log groups only (checkov CKV_AWS_158).
        log_group_name = control_plane_log_group(cluster_name)
        self.logs_key = log_group_key(
            self, "LogsKey", [log_group_name, f"{handler_log_group_prefix(cluster_name)}*"], f"{cluster_name} logs"
        )
        self.control_plane_logs = logs.LogGroup(
            self,
            "ControlPlaneLogs",
            log_group_name=log_group_name,
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=cdk.RemovalPolicy.DESTROY,
            encryption_key=self.logs_key,
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=eks.KubernetesVersion.of(kubernetes_version),
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnets=list(subnets))],
            endpoint_access=endpoint,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            secrets_encryption_key=secrets_key,
            cluster_logging=[
                eks.ClusterLoggingTypes.API,
                eks.ClusterLoggingTypes.AUDIT,
                eks.ClusterLoggingTypes.AUTHENTICATOR,
                eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
                eks.ClusterLoggingTypes.SCHEDULER,
            ],
            # The kubectl/helm handler runs in the private subnets: it reaches the API through the private
            # endpoint (whatever api_allowed_cidrs says) and pulls charts through NAT.
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KubectlV35Layer(self, "KubectlLayer"),
                private_subnets=list(subnets),
            ),
        )
        self.cluster.node.add_dependency(self.control_plane_logs)
        self.handler_logs = self._own_handler_logs(cluster_name)
        if admin_principal_arn:
            self.cluster.grant_access(
                "Admin",
                admin_principal_arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )
        self.system_nodes = Construct(self, "SystemNodes")  # a dependency on it covers each group under it
        self.system_nodegroups = self._system_nodegroups(self.system_nodes, system_instance_type, subnets, system_nodes)
        # Pod Identity: the training service account gets S3 access without IRSA's OIDC plumbing. The
        # cluster creates this add-on once, on first use (a second explicit add-on would be a duplicate).
        self.pod_identity_agent = self.cluster.eks_pod_identity_agent
        # Static FSx volumes only (the file system comes from the storage stack), so the driver needs no IAM:
        # mounting is done by the node plugin. The add-on version follows the cluster version's default.
        self.fsx_csi_driver = eks.Addon(self, "FsxCsiDriver", cluster=self.cluster, addon_name="aws-fsx-csi-driver")
        # The VPC CNI as a managed add-on with network policy enforcement on (its node agent): without it the
        # etcd namespace's NetworkPolicy (only training pods may reach the jobs' etcd) would be
        # accepted by the API server and enforced by nothing. EKS installs the CNI self-managed at cluster
        # creation; OVERWRITE lets the add-on take over those objects (the version follows the cluster default).
        self.vpc_cni = eks.Addon(
            self,
            "VpcCni",
            cluster=self.cluster,
            addon_name="vpc-cni",
            configuration_values={"enableNetworkPolicy": "true"},
        )
        self.vpc_cni.node.default_child.add_property_override("ResolveConflicts", "OVERWRITE")
        for addon in (self.pod_identity_agent, self.fsx_csi_driver):
            addon.node.add_dependency(self.system_nodes)

    def _system_nodegroups(
        self, scope: Construct, instance_type: str, subnets: Sequence[ec2.ISubnet], count: int
    ) -> list[eks.Nodegroup]:
        """The system nodes, ``count`` in all, as one managed node group per subnet (AZ), dealt in turn (3 over 2
        AZs: 2 and 1), each of at least one node.

        Why per AZ: each etcd member's volume is zonal (EBS) and each member needs a node of its own (required
        anti-affinity). A node group over several AZs may replace a lost node, or surge during an update, in
        another AZ: the member whose volume is in the first AZ then stays Pending, and its PodDisruptionBudget
        stalls the drain of the next node. A group in one AZ replaces and surges in that AZ only, so a member's
        AZ keeps as many nodes as it had (docs/kubernetes.md, "A lost etcd member").
        """
        sizes = [count // len(subnets) + (i < count % len(subnets)) for i in range(len(subnets))]
        groups = []
        for i, (subnet, size) in enumerate(zip(subnets, sizes)):
            if not size:
                continue  # fewer nodes than AZs: the members' volumes are only where nodes are
            groups.append(
                eks.Nodegroup(
                    scope,
                    f"Az{i}",
                    cluster=self.cluster,
                    instance_types=[ec2.InstanceType(instance_type)],
                    ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
                    min_size=size,
                    desired_size=size,
                    max_size=size + 1,  # room for a replacement before the lost node is gone
                    disk_size=50,
                    subnets=ec2.SubnetSelection(subnets=[subnet]),
                    labels=SYSTEM_POOL_LABEL,
                    enable_node_auto_repair=True,
                )
            )
        return groups

    def _own_handler_logs(self, cluster_name: str) -> list[logs.LogGroup]:
        """The kubectl handler's Lambda functions (the handler and its provider framework) log to log groups of the
        stack's own, with a retention, deleted with it: left to Lambda, each would create ``/aws/lambda/<name>`` on
        first use, outside the stack, kept forever after a destroy."""
        groups = []
        functions = [
            f
            for f in self.cluster.node.find_all()
            if isinstance(f, lambda_.CfnFunction) and "KubectlProvider" in f.node.path
        ]
        for fn in sorted(functions, key=lambda f: f.node.path):
            name = fn.node.scope.node.id  # "Handler", "framework-onEvent"
            group = logs.LogGroup(
                self,
                f"KubectlLogs{name.title().replace('-', '')}",
                log_group_name=f"{handler_log_group_prefix(cluster_name)}{name.lower()}",
                retention=HANDLER_LOG_RETENTION,
                removal_policy=cdk.RemovalPolicy.DESTROY,
                encryption_key=self.logs_key,
            )
            fn.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
            groups.append(group)
        return groups

"""The jobs' membership store: a 3-member etcd on the system nodes (objects: cluster_assets/k8s/etcd.py).

What this construct adds around the rendered objects: the administration image (built once from
cluster_assets/etcd_admin_image/ as a CDK asset, in CDK's own asset repository: never the training image, see
cluster_assets/k8s/etcd.py), the EBS CSI driver (managed add-on, Pod Identity with AWS's
EBS CSI policy) that provisions the members' volumes, and the order things must be created in (the etcd namespace,
then the members; the administration objects after the training namespace, where they write the agents' Secret).
"""

from __future__ import annotations

from typing import Any, Mapping

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from cluster_assets.k8s import etcd
from cluster_facts.versions import ETCD_ADMIN_BASE_IMAGE, ETCD_IMAGE
from stacks.eks_nag import managed_policy_finding
from stacks.nag import acknowledge

EBS_CSI_CONTROLLER_SA = "ebs-csi-controller-sa"  # the add-on's controller service account (kube-system)


class EtcdCluster(Construct):
    """3 etcd members (StatefulSet, PodDisruptionBudget, NetworkPolicy, TLS, auth) and their administration.

    Attributes:
        objects: the rendered Kubernetes objects by group (namespace, members, admin), as installed.
        endpoints: the members' client URLs the runtime gives the agents.
        admin_image: the administration image asset (its ``image_uri`` is what the administration pods and the
            members run: Python for the members' start-time repair, and etcd's binary from the pinned etcd image).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        training_namespace: str,
        training_namespace_manifest: IConstruct,
        system_node_labels: Mapping[str, str],
        system_nodes: IConstruct,
    ) -> None:
        super().__init__(scope, construct_id)
        # Built by `cdk deploy` (Docker) only when its digest is not in the asset repository yet; synth only stages
        # the directory. The system nodes are x86_64 (AL2023_X86_64_STANDARD).
        self.admin_image = ecr_assets.DockerImageAsset(
            self,
            "AdminImage",
            directory=str(etcd.ADMIN_IMAGE_DIR),
            build_args={"BASE_IMAGE": ETCD_ADMIN_BASE_IMAGE, "ETCD_IMAGE": ETCD_IMAGE},
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.objects: dict[str, list[dict[str, Any]]] = etcd.cluster_objects(
            admin_image=self.admin_image.image_uri,
            training_namespace=training_namespace,
            node_selector=dict(system_node_labels),
        )
        self.endpoints = etcd.endpoints()
        self.ebs_csi_driver = self._ebs_csi_driver(cluster)
        self.ebs_csi_driver.node.add_dependency(system_nodes)

        namespace = cluster.add_manifest("EtcdNamespace", *self.objects["namespace"])
        # Created after the EBS CSI driver, so deleted before it: the driver is still there to delete the members'
        # volumes when the namespace (and with it the claims) goes; the other way round they would be orphaned.
        namespace.node.add_dependency(self.ebs_csi_driver)
        members = cluster.add_manifest("EtcdMembers", *self.objects["members"])
        members.node.add_dependency(namespace, self.ebs_csi_driver)
        admin = cluster.add_manifest("EtcdAdmin", *self.objects["admin"])
        admin.node.add_dependency(namespace, training_namespace_manifest)

    def _ebs_csi_driver(self, cluster: eks.Cluster) -> eks.Addon:
        """The managed EBS CSI driver, its controller allowed to create and attach volumes through Pod Identity."""
        role = iam.Role(
            self,
            "EbsCsiRole",
            assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"),
            description="EBS CSI driver controller (etcd members' volumes)",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AmazonEBSCSIDriverPolicy")],
        )
        # Pod Identity's trust needs TagSession besides AssumeRole.
        role.assume_role_policy.add_statements(
            iam.PolicyStatement(actions=["sts:TagSession"], principals=[iam.ServicePrincipal("pods.eks.amazonaws.com")])
        )
        acknowledge(
            role,
            managed_policy_finding("service-role/AmazonEBSCSIDriverPolicy"),
            "AWS's policy for the EBS CSI driver (create, attach, tag volumes and snapshots); it tracks the "
            "driver's needs, which a hand-written copy would miss; only the driver's controller assumes it.",
        )
        addon = eks.Addon(self, "EbsCsiDriver", cluster=cluster, addon_name="aws-ebs-csi-driver")
        association = eks_l1.CfnPodIdentityAssociation(
            self,
            "EbsCsiPodIdentity",
            cluster_name=cluster.cluster_name,
            namespace="kube-system",
            service_account=EBS_CSI_CONTROLLER_SA,
            role_arn=role.role_arn,
        )
        association.node.add_dependency(cluster.eks_pod_identity_agent)
        addon.node.add_dependency(association)
        return addon

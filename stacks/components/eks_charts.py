"""Pinned Helm charts: NVIDIA + EFA device plugins, Kubeflow Trainer v2 (with JobSet)."""

from __future__ import annotations

from typing import Mapping

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cluster_facts import GPU_TAINT_KEY
from stacks import versions

GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


class GpuDevicePlugins(Construct):
    """DaemonSets advertising ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` on the GPU nodes.

    Not built into EKS managed node groups; both must tolerate the GPU taint and target the GPU pool.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, gpu_node_labels: Mapping[str, str]
    ) -> None:
        super().__init__(scope, construct_id)
        self.nvidia = eks.HelmChart(
            self,
            "Nvidia",
            cluster=cluster,
            repository=versions.NVIDIA_DEVICE_PLUGIN_REPO,
            chart=versions.NVIDIA_DEVICE_PLUGIN_CHART,
            version=versions.NVIDIA_DEVICE_PLUGIN_VERSION,
            release="nvidia-device-plugin",
            namespace="kube-system",
            values={"tolerations": [GPU_TOLERATION], "nodeSelector": dict(gpu_node_labels)},
        )
        self.efa = eks.HelmChart(
            self,
            "Efa",
            cluster=cluster,
            repository=versions.EFA_DEVICE_PLUGIN_REPO,
            chart=versions.EFA_DEVICE_PLUGIN_CHART,
            version=versions.EFA_DEVICE_PLUGIN_VERSION,
            release="aws-efa-k8s-device-plugin",
            namespace="kube-system",
            values={"tolerations": [GPU_TOLERATION], "nodeSelector": dict(gpu_node_labels)},
        )


class KubeflowTrainer(Construct):
    """Kubeflow Trainer v2 control plane from its OCI Helm chart, with JobSet as a chart dependency.

    Helm, not ``add_manifest``: the Trainer CRDs are ~740 KB, beyond what ``kubectl create`` can store in the
    last-applied annotation that ``kubectl create --save-config`` writes (limit ~256 KB). The chart is pulled at deploy
    time over NAT.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        chart_version: str,
        system_node_labels: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            # The handler pulls oci:// charts itself; the last path segment is the chart name.
            repository=versions.TRAINER_CHART_OCI,
            chart=versions.TRAINER_CHART,
            version=chart_version,
            release="kubeflow-trainer",
            namespace=versions.TRAINER_NAMESPACE,
            create_namespace=True,
            values={
                "jobset": {"install": True},
                # Only our own fault-tolerant runtime is installed (see TrainingNamespace).
                "runtimes": {"defaultEnabled": False},
                # TrainJobStatus (alpha): the controller gives the training containers an endpoint for
                # TrainJob.status.trainerStatus, which rank 0 reports progress into (training.job.trainer_status).
                "manager": {
                    "nodeSelector": dict(system_node_labels),
                    "config": {"featureGates": {"TrainJobStatus": True}},
                },
            },
            # Wait for the controller and its webhooks before the runtime object is created.
            wait=True,
            timeout=cdk.Duration.minutes(15),
        )

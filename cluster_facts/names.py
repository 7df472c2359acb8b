"""Names and defaults that the stacks deploy and the cluster-side code refers to.

The stacks create these objects (``stacks/config.py`` defaults, the EKS training namespace, the
ParallelCluster queue); the runtime renderer, the submit tools and the batch script must use the same
names, so both sides import them from here. A deployment may override the namespace, runtime name, instance
type, image tag and restart budget with CDK context; the submit tool then reads the deployed values from the
stack outputs (``--outputs-file``), and these constants are only its defaults.
"""

from __future__ import annotations

TRAINING_NAMESPACE = "training"
"""Kubernetes namespace of the TrainJobs, the FSx claim and the S3 service account (context trainingNamespace)."""

RUNTIME_NAME = "t5-fault-tolerant"
"""Name of the fault-tolerant ClusterTrainingRuntime the EKS stack installs (context runtimeName)."""

FSX_PVC_NAME = "fsx-claim"
"""PersistentVolumeClaim of the FSx for Lustre volume in the training namespace."""

FSX_MOUNT_PATH = "/fsx"
"""Where FSx for Lustre is mounted: in every training pod and on every ParallelCluster node."""

MEMORY_DIR_ENV = "T5F_MEMORY_DIR"
"""Environment variable naming the node-local directory of the in-memory snapshots (training.checkpoint.memory)."""

NODE_MEMORY_DIR = "/dev/shm/t5-failover"
"""The in-memory snapshots' directory on a node (its tmpfs): the training default on Slurm nodes; on EKS the
node's copy of it is mounted into the training pods, so snapshots outlive a recreated pod."""

GPU_TAINT_KEY = "nvidia.com/gpu"
"""Taint (NoSchedule) of the EKS GPU node group; training pods and GPU device plugins tolerate it."""

NODE_POOL_LABEL = "t5-failover/pool"
"""Node label of the EKS node groups: :data:`SYSTEM_POOL` (controllers and the jobs' rendezvous stores) or
:data:`GPU_POOL` (training pods)."""

SYSTEM_POOL = "system"
GPU_POOL = "gpu"

COMPONENT_LABEL = "t5-failover/component"
"""Pod label the runtime sets: :data:`RDZV_STORE_COMPONENT` on a job's rendezvous store pod,
:data:`TRAINING_COMPONENT` on its training pods; the training namespace's NetworkPolicy selects by it."""

RDZV_STORE_COMPONENT = "rdzv-store"
TRAINING_COMPONENT = "training"

GPU_QUEUE = "gpu"
"""Slurm partition (ParallelCluster queue) of the GPU nodes."""

DEFAULT_GPU_INSTANCE_TYPE = "p5.48xlarge"
"""GPU instance type of a default deployment (context gpuInstanceType)."""

IMAGE_REPOSITORY = "t5-train"
"""Name of the training image's ECR repository under the deployment's prefix: see :func:`image_repository`."""

DEFAULT_IMAGE_TAG = "0.1.0"
"""Tag of the runtime's default image (context imageTag): only TrainJobs that name no image use it. ``make image``
tags each build with its content (``tools.image_tag``) and ``make train PLATFORM=eks`` submits that tag; deploy
with ``-c imageTag=<that tag>`` to make it the runtime's default too."""

DEFAULT_MAX_RESTARTS = 10
"""JobSet whole-job restarts before a TrainJob fails (context maxRestarts)."""

RDZV_STORE_PORT = 29400
"""TCP port of the standalone rendezvous store (``python -m training.rdzv_store``) on the ParallelCluster head
node: the batch script points every agent at ``<head node>:RDZV_STORE_PORT`` and the stack opens this port on
the head node to the compute nodes only."""

RDZV_STORE_UNIT = "t5-rdzv-store.service"
"""systemd unit that keeps the rendezvous store running on the ParallelCluster head node."""

ETCD_ENV_FILE = "/etc/t5-failover/etcd.env"
"""On the ParallelCluster head node: the ``T5_ETCD_*`` settings of the stack's etcd members (root's credentials),
written by the node setup (``cluster_assets/parallelcluster/node_setup/etcd_client.sh``), exported in login shells
and what ``make train PLATFORM=slurm`` names when a job has no etcd."""


def image_repository(name_prefix: str) -> str:
    """The ECR repository the storage stack creates for deployment ``name_prefix`` (``t5ft`` -> ``t5ft/t5-train``)."""
    return f"{name_prefix}/{IMAGE_REPOSITORY}"

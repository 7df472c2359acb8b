"""Facts several parts of the project share, in one place: what the stacks deploy and the cluster-side code
(runtime and batch-script renderers, submit tools, the launcher) must agree on.

Standard library only (a test parses every import): importable by the CDK app, the host-side tools and the
training image alike. One module per group of facts:

* :mod:`cluster_facts.gpu_instances`: GPU instance types and their GPUs, EFA interfaces, GPUDirect RDMA;
* :mod:`cluster_facts.names`: resource names and deployment defaults (namespace, runtime, FSx claim, ECR
  repository, ...);
* :mod:`cluster_facts.nccl_env`: the NCCL/EFA environment of the training processes;
* :mod:`cluster_facts.timeouts`: the timeouts of each platform, which must nest;
* :mod:`cluster_facts.torchrun_env`: the environment torchrun's agents need on every platform.
"""

from __future__ import annotations

from cluster_facts.gpu_instances import GPU_INSTANCES, GpuInstanceSpec, gpu_instance
from cluster_facts.names import (
    DEFAULT_GPU_INSTANCE_TYPE,
    DEFAULT_IMAGE_TAG,
    DEFAULT_MAX_RESTARTS,
    FSX_MOUNT_PATH,
    FSX_PVC_NAME,
    GPU_QUEUE,
    GPU_TAINT_KEY,
    IMAGE_REPOSITORY,
    MEMORY_DIR_ENV,
    NODE_MEMORY_DIR,
    RDZV_STORE_PORT,
    RDZV_STORE_UNIT,
    RUNTIME_NAME,
    TRAINING_NAMESPACE,
    image_repository,
)
from cluster_facts.nccl_env import EFA_LIBRARY_DIRS, NCCL_NET_PLUGIN_LIBRARY, nccl_env
from cluster_facts.timeouts import SHUTDOWN_MARGIN_S, TIMEOUTS, PlatformTimeouts, platform_timeouts
from cluster_facts.torchrun_env import IDENTICAL_WORKERS_ENV, RDZV_ENV

__all__ = [
    "GPU_INSTANCES",
    "GpuInstanceSpec",
    "gpu_instance",
    "DEFAULT_GPU_INSTANCE_TYPE",
    "DEFAULT_IMAGE_TAG",
    "DEFAULT_MAX_RESTARTS",
    "FSX_MOUNT_PATH",
    "FSX_PVC_NAME",
    "GPU_QUEUE",
    "GPU_TAINT_KEY",
    "IMAGE_REPOSITORY",
    "MEMORY_DIR_ENV",
    "NODE_MEMORY_DIR",
    "RDZV_STORE_PORT",
    "RDZV_STORE_UNIT",
    "RUNTIME_NAME",
    "TRAINING_NAMESPACE",
    "image_repository",
    "EFA_LIBRARY_DIRS",
    "NCCL_NET_PLUGIN_LIBRARY",
    "nccl_env",
    "SHUTDOWN_MARGIN_S",
    "TIMEOUTS",
    "PlatformTimeouts",
    "platform_timeouts",
    "IDENTICAL_WORKERS_ENV",
    "RDZV_ENV",
]

"""The fault-tolerant Kubeflow Trainer runtime for the T5 job, as a plain Kubernetes object (a dict).

Pure function, no CDK or cluster access: the EKS stack installs what it returns, and tests (or an offline
emulator) can render and inspect the exact same object. Targets the Trainer v2.2+/v2.3 API
(``trainer.kubeflow.org/v1alpha1``) with JobSet v1alpha2 underneath.

How a failure is handled (the reason for every field below):

* Any pod of the job fails -> its Job fails at once (``backoffLimit: 0``, pod ``restartPolicy: Never``: a lone
  restarted pod could not rejoin a running torchrun rendezvous) -> the JobSet ``failurePolicy`` recreates
  *all* pods, up to ``maxRestarts`` times, and the training package resumes from the newest complete
  checkpoint on the shared FSx volume.
* A pod evicted or preempted by the infrastructure (condition ``DisruptionTarget``: node drain, spot
  reclaim, node auto-repair) also fails its Job immediately via ``podFailurePolicy``; that restart does not
  count against ``maxRestarts`` (infrastructure churn should not use up the job's budget).
* Exit codes that a restart cannot fix (training's 2 = bad config, 3 = checkpoint incompatible with the
  model) fail the whole TrainJob instead of looping.
* The in-memory snapshots (``training.memory_tier``) live in the node's ``/dev/shm/t5-failover`` (a hostPath),
  not in the pod: the recreated pods restore from them (or a lost node's shards from its peer's replica)
  instead of going back to the storage checkpoint.
* ``ttlSecondsAfterFinished`` is deliberately not set (kubeflow/trainer#3737: restart-count reset loop).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from cluster_facts import FSX_MOUNT_PATH, GPU_TAINT_KEY, MEMORY_DIR_ENV, NODE_MEMORY_DIR, nccl_env, platform_timeouts

API_VERSION = "trainer.kubeflow.org/v1alpha1"
#: The replicated job and container the Trainer torch plugin injects PET_* variables into.
NODE = "node"
#: Exit codes of ``python -m training`` that no restart can fix: 2 bad config, data or device, 3 checkpoint of
#: another model, 4 checkpoint of a run with other settings, 5 diverged (a rerun replays the same steps),
#: 7 checkpoint.dir held by another run. 6 (storage) stays retryable: space may be freed meanwhile.
NON_RETRYABLE_EXIT_CODES = (2, 3, 4, 5, 7)
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
#: Where the node's snapshot directory (cluster_facts.NODE_MEMORY_DIR, a hostPath) appears in the pod.
SNAPSHOT_MOUNT_PATH = "/var/run/t5-failover/memory"


def build_cluster_training_runtime(
    *,
    name: str,
    pvc_name: str,
    image: str,
    max_restarts: int,
    gpus_per_node: int,
    efa_per_node: int,
    gpudirect_rdma: bool = False,
    num_nodes: int = 1,
    namespace: Optional[str] = None,
    fsx_mount_path: str = FSX_MOUNT_PATH,
    shm_size: str = "64Gi",
    termination_grace_period_s: int = platform_timeouts("eks").grace_s,
    non_retryable_exit_codes: Sequence[int] = NON_RETRYABLE_EXIT_CODES,
    node_selector: Optional[dict[str, str]] = None,
    env: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """Render the fault-tolerant torch runtime.

    Args:
        name: object name (a DNS-1123 label); TrainJobs reference it in ``spec.runtimeRef.name``.
        pvc_name: PersistentVolumeClaim of the shared file system (FSx for Lustre), mounted at
            ``fsx_mount_path`` in every training pod; checkpoints must live there to survive restarts.
        image: default training image (a TrainJob may override it in ``spec.trainer.image``).
        max_restarts: JobSet ``failurePolicy.maxRestarts``: whole-job restarts before the TrainJob fails.
        gpus_per_node: ``nvidia.com/gpu`` per pod (one pod per node); 0 for CPU-only test clusters.
        efa_per_node: ``vpc.amazonaws.com/efa`` interfaces per pod; 0 disables EFA (no resource, no env).
        gpudirect_rdma: the instance type's EFA supports GPUDirect RDMA
            (:attr:`cluster_facts.GpuInstanceSpec.gpudirect_rdma`); only with EFA.
        num_nodes: default ``mlPolicy.numNodes`` (TrainJob ``spec.trainer.numNodes`` overrides it).
        namespace: None renders a cluster-scoped ``ClusterTrainingRuntime``; a namespace renders the same
            spec as a namespaced ``TrainingRuntime`` there (handy for per-team or test installs).
        fsx_mount_path: where the shared volume is mounted.
        shm_size: size limit of the memory-backed ``/dev/shm`` (NCCL and data-loader workers need more than
            the container default of 64 MiB).
        termination_grace_period_s: time between SIGTERM and SIGKILL; the training package saves a
            checkpoint at the next step boundary on SIGTERM, and the torchrun agent waits for that up to its
            shutdown timeout, which this must exceed. Default: the EKS row of :data:`cluster_facts.TIMEOUTS`.
        non_retryable_exit_codes: container exit codes that fail the TrainJob without restarting.
        node_selector: optional node labels the pods must match (e.g. the GPU node group's label).
        env: extra environment for the ``node`` container. ``PET_*`` names are reserved for the Trainer.

    Returns:
        A JSON-serialisable dict, ready for ``kubectl apply`` or CDK ``add_manifest``.
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts}: must be >= 0")
    if gpus_per_node < 0 or efa_per_node < 0:
        raise ValueError(f"gpus_per_node={gpus_per_node}, efa_per_node={efa_per_node}: must be >= 0")
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes}: must be >= 1")
    if not pvc_name:
        raise ValueError("pvc_name is required: checkpoints must be on shared storage to survive restarts")
    reserved = sorted(k for k in (env or {}) if k.startswith("PET_"))
    if reserved:
        raise ValueError(f"env {reserved}: PET_* variables are set by the Trainer torch plugin; remove them")
    if termination_grace_period_s < 30:
        raise ValueError(f"termination_grace_period_s={termination_grace_period_s}: allow >= 30 s to checkpoint")
    if gpudirect_rdma and not (gpus_per_node and efa_per_node):
        raise ValueError("gpudirect_rdma=True needs GPUs and EFA (gpus_per_node and efa_per_node > 0)")

    container_env = _default_env(gpus_per_node, efa_per_node, gpudirect_rdma) | dict(env or {})
    # Quantities as strings: the canonical Kubernetes form (and what the typed API models round-trip).
    limits: dict[str, str] = {}
    if gpus_per_node:
        limits[GPU_RESOURCE] = str(gpus_per_node)
    if efa_per_node:
        limits[EFA_RESOURCE] = str(efa_per_node)

    container: dict[str, Any] = {
        "name": NODE,
        "image": image,
        "env": [{"name": k, "value": v} for k, v in container_env.items()],
        "volumeMounts": [
            {"name": "fsx", "mountPath": fsx_mount_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "snapshots", "mountPath": SNAPSHOT_MOUNT_PATH},
        ],
    }
    if limits:
        # Extended resources need requests == limits; giving limits alone makes Kubernetes copy them.
        container["resources"] = {"limits": limits}

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": termination_grace_period_s,
        "containers": [container],
        "volumes": [
            {"name": "fsx", "persistentVolumeClaim": {"claimName": pvc_name}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
            # The in-memory snapshots must outlive the pod: every restart recreates all pods (Recreate
            # below), and an emptyDir would go with them. The node's tmpfs keeps them for the new pod.
            {"name": "snapshots", "hostPath": {"path": NODE_MEMORY_DIR, "type": "DirectoryOrCreate"}},
        ],
    }
    if gpus_per_node:
        pod_spec["tolerations"] = [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)

    pod_failure_rules: list[dict[str, Any]] = []
    if non_retryable_exit_codes:
        pod_failure_rules.append({
            "action": "FailJob",
            "onExitCodes": {"containerName": NODE, "operator": "In",
                            "values": sorted(set(non_retryable_exit_codes))},
        })
    pod_failure_rules.append({
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    })

    jobset_rules: list[dict[str, Any]] = []
    if non_retryable_exit_codes:
        codes = "|".join(str(c) for c in sorted(set(non_retryable_exit_codes)))
        jobset_rules.append({
            "name": "NonRetryableExitCode",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            # The Job controller's message for a podFailurePolicy exit-code match.
            "onJobFailureMessagePatterns": [f"failed with exit code ({codes}) matching FailJob rule"],
        })
    jobset_rules.append({
        "name": "InfrastructureDisruption",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": ["condition DisruptionTarget matching FailJob rule"],
    })
    # Anything else (a crash, a lost node, an OOM kill) falls through to RestartJobSet, bounded by maxRestarts.

    metadata: dict[str, Any] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if namespace is not None:
        metadata["namespace"] = namespace

    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime",
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": num_nodes, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": {
                        "maxRestarts": max_restarts,
                        "restartStrategy": "Recreate",
                        "rules": jobset_rules,
                    },
                    "replicatedJobs": [{
                        "name": NODE,
                        "replicas": 1,
                        "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {
                                "backoffLimit": 0,
                                "podFailurePolicy": {"rules": pod_failure_rules},
                                "template": {"spec": pod_spec},
                            },
                        },
                    }],
                },
            },
        },
    }


def _default_env(gpus_per_node: int, efa_per_node: int, gpudirect_rdma: bool) -> dict[str, str]:
    """Environment every training pod gets: the rendezvous fix-up, and on GPU pods the NCCL/EFA environment
    shared with the Slurm batch script (:func:`cluster_facts.nccl_env`)."""
    env = {
        # torch 2.13: a node joining a later rendezvous round deadlocks while agents share the rendezvous
        # TCPStore with their workers (pytorch#147064). The launcher sets it as well; the runtime sets it for
        # any TrainJob that runs torchrun itself instead of the launcher. (Slurm jobs always go through the
        # launcher, so the batch script does not need it.)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        MEMORY_DIR_ENV: SNAPSHOT_MOUNT_PATH,  # the in-memory snapshots on the node's tmpfs (see the volumes)
    }
    if gpus_per_node:
        env |= nccl_env(efa=efa_per_node > 0, gpudirect_rdma=gpudirect_rdma)
    return env

"""The fault-tolerant Kubeflow Trainer runtime for the T5 job, as a plain Kubernetes object (a dict).

Pure function, no CDK or cluster access: the EKS stack installs what it returns, and tests (or an offline
emulator) can render and inspect the exact same object. Targets the Trainer v2.2+/v2.3 API
(``trainer.kubeflow.org/v1alpha1``) with JobSet v1alpha2 (v0.12) underneath and batch/v1 Jobs below that.

Two replicated jobs:

* ``store`` (1 Job, 1 pod, CPU only, on the system node group): ``python -m training.rdzv_store``, the c10d
  rendezvous store, so that no training pod hosts it (losing the store host kills a c10d job, pytorch#67742).
  Labelled ``t5-failover/component: rdzv-store``; the training namespace's NetworkPolicy lets only training
  pods reach its port. Trainer v2.3 leaves a replicated job without the ``trainjob-ancestor-step`` label alone:
  no ``PET_*`` env, no TrainJob image/command/env/resources; it sets its ``parallelism``/``completions`` to the
  template's ``parallelism`` (default 1). So the store always runs the runtime's image (``imageTag``).
* ``node`` (label ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``): the training pods. The Trainer
  sets ``parallelism = completions = numNodes`` and injects ``PET_*`` into container ``node``;
  ``completionMode: Indexed`` (JobSet's webhook defaults it, rendered explicitly because per-index retry
  requires it) gives each pod its index (``PET_NODE_RANK``) and the stable hostname ``<job>-node-0-<index>``.
  The runtime adds ``JOBSET_NAME`` (downward API, label ``jobset.sigs.k8s.io/jobset-name``),
  ``T5_RDZV_ENDPOINT=$(JOBSET_NAME)-store-0-0.$(JOBSET_NAME):29400`` (JobSet pod DNS:
  ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>``, subdomain = the JobSet name, a headless
  Service publishing not-ready pods too) and ``T5_RDZV_ID=trainjob-$(JOBSET_NAME)`` (what
  ``training.launch`` would derive from ``PET_MASTER_ADDR`` anyway; the store is pinned to the same id).
  ``dependsOn: [{name: store, status: Ready}]``: JobSet creates the node Job once the store pod passes its
  TCP readiness probe.

How a failure is handled (the reason for every field below):

* A training pod fails (crash, OOM, lost node, ``kubectl delete pod``: exit != 0) -> batch/v1 per-index retry:
  ``backoffLimitPerIndex`` (default 3) lets the Job controller recreate *that index's pod only*, same hostname
  (``podReplacementPolicy: Failed``: the new pod is created once the old one is gone, never two agents for one
  index). The survivors' torchrun agents lose a peer, restart their workers and wait in the rendezvous (the store
  is elsewhere, so any pod, node 0's included, may die); the replacement joins, the round re-forms and training
  resumes from the newest checkpoint. No JobSet restart, the other pods keep running.
* A pod evicted or preempted by the infrastructure (pod condition ``DisruptionTarget``: drain, spot reclaim,
  node auto-repair): ``podFailurePolicy`` action ``Ignore`` replaces it without using the index's retries.
* Exit codes that a restart cannot fix (:data:`NON_RETRYABLE_EXIT_CODES`): ``podFailurePolicy`` ``FailJob``
  -> Job failed (reason ``PodFailurePolicy``) -> JobSet ``failurePolicy`` rule ``NonRetryableExitCode``
  (``FailJobSet``) -> the TrainJob fails without looping.
* Fallback, JobSet gang restart (``failurePolicy.maxRestarts``, ``restartStrategy: Recreate``: every pod of
  both jobs recreated, the training package resumes from the newest complete checkpoint on FSx):
  an index fails more than ``backoffLimitPerIndex`` times -> ``maxFailedIndexes: 0`` fails the node Job at once
  (reason ``MaxFailedIndexesExceeded``; without it the other indexes would wait in the rendezvous until their
  join timeout) -> rule ``NodeRetriesExhausted`` (``RestartJobSet``, counted); the store pod fails
  (``backoffLimit: 0``, pod ``restartPolicy: Never``: a restarted store comes back empty and torch's TCPStore
  clients do not reconnect, so restarting it in place cannot save the running rendezvous) -> rule ``StoreLost``
  (``RestartJobSet``, counted), or ``StoreDisrupted`` (``RestartJobSetAndIgnoreMaxRestarts``) when the store
  pod was evicted.
* Success: JobSet ``successPolicy`` ``{operator: All, targetReplicatedJobs: [node]}``: the JobSet (and the
  TrainJob) completes when every node pod has succeeded, although the store never exits; JobSet then deletes the
  store Job.
* The in-memory snapshots (``training.checkpoint.memory``) live in the node's ``/dev/shm/t5-failover`` (a hostPath),
  not in the pod: a pod recreated on the same node restores from them (or a lost node's shards from its peer's
  replica) instead of going back to the storage checkpoint.
* ``ttlSecondsAfterFinished`` is deliberately not set (kubeflow/trainer#3737: restart-count reset loop).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from cluster_facts import (FSX_MOUNT_PATH, GPU_TAINT_KEY, MEMORY_DIR_ENV, NODE_MEMORY_DIR, RDZV_STORE_PORT, nccl_env,
                           platform_timeouts)
from cluster_facts.names import COMPONENT_LABEL, RDZV_STORE_COMPONENT, TRAINING_COMPONENT

API_VERSION = "trainer.kubeflow.org/v1alpha1"
#: The replicated job and container the Trainer torch plugin injects PET_* variables into.
NODE = "node"
#: The replicated job (and container) of the rendezvous store.
STORE = "store"
#: TCP port of the rendezvous store (the same default as the Slurm head-node store).
STORE_PORT = RDZV_STORE_PORT
#: Label JobSet puts on every pod it creates, naming its JobSet (= the TrainJob's name).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: ``$(JOBSET_NAME)`` is expanded by the kubelet from the env var of that name (listed before its users).
RDZV_ID = "trainjob-$(JOBSET_NAME)"
#: JobSet's pod DNS name of the store: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain = jobset>.
RDZV_ENDPOINT = f"$(JOBSET_NAME)-{STORE}-0-0.$(JOBSET_NAME):{STORE_PORT}"
#: Exit codes of ``python -m training`` that no restart can fix: 2 bad config, data or device, 3 checkpoint of
#: another model, 4 checkpoint of a run with other settings, 5 diverged (a rerun replays the same steps),
#: 7 checkpoint.dir held by another run. 6 (storage) stays retryable: space may be freed meanwhile.
NON_RETRYABLE_EXIT_CODES = (2, 3, 4, 5, 7)
#: Failures of one training pod (one index) the Job controller retries before the JobSet restarts the gang.
DEFAULT_RETRIES_PER_INDEX = 3
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
#: Where the node's snapshot directory (cluster_facts.NODE_MEMORY_DIR, a hostPath) appears in the pod.
SNAPSHOT_MOUNT_PATH = "/var/run/t5-failover/memory"
#: The store holds a few KB of rendezvous state; the requests only have to fit the interpreter and torch.
STORE_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
#: The store keeps nothing worth a graceful stop: its state dies with it either way.
STORE_GRACE_S = 5


def _jobset_name_env() -> dict[str, Any]:
    return {"name": "JOBSET_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}}


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
    retries_per_index: int = DEFAULT_RETRIES_PER_INDEX,
    node_selector: Optional[dict[str, str]] = None,
    store_node_selector: Optional[dict[str, str]] = None,
    env: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """Render the fault-tolerant torch runtime (a ``store`` and a ``node`` replicated job, see the module doc).

    Args:
        name: object name (a DNS-1123 label); TrainJobs reference it in ``spec.runtimeRef.name``.
        pvc_name: PersistentVolumeClaim of the shared file system (FSx for Lustre), mounted at
            ``fsx_mount_path`` in every training pod; checkpoints must live there to survive restarts.
        image: default training image (a TrainJob may override it in ``spec.trainer.image`` for the training
            pods only; the store pod always runs this one, so it must exist in the registry).
        max_restarts: JobSet ``failurePolicy.maxRestarts``: whole-job (gang) restarts before the TrainJob fails.
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
        retries_per_index: ``backoffLimitPerIndex`` of the node Job: counted failures of one training pod that
            the Job controller replaces alone; one more fails the node Job and the JobSet restarts the gang.
            0 = every training pod failure is a gang restart.
        node_selector: optional node labels the training pods must match (e.g. the GPU node group's label).
        store_node_selector: optional node labels the store pod must match (e.g. the system node group's).
        env: extra environment for the ``node`` container. ``PET_*`` names are reserved for the Trainer.

    Returns:
        A JSON-serialisable dict, ready for ``kubectl apply`` or CDK ``add_manifest``.
    """
    _check_runtime_arguments(max_restarts=max_restarts, retries_per_index=retries_per_index,
                             gpus_per_node=gpus_per_node, efa_per_node=efa_per_node, num_nodes=num_nodes,
                             pvc_name=pvc_name, env=env, termination_grace_period_s=termination_grace_period_s,
                             gpudirect_rdma=gpudirect_rdma)
    codes = sorted(set(non_retryable_exit_codes))
    # dependsOn must name the previous replicated job: the store comes first.
    replicated_jobs = [
        _store_job(image, store_node_selector),
        _node_job(image=image, pvc_name=pvc_name, gpus_per_node=gpus_per_node, efa_per_node=efa_per_node,
                  gpudirect_rdma=gpudirect_rdma, fsx_mount_path=fsx_mount_path, shm_size=shm_size,
                  grace_s=termination_grace_period_s, codes=codes, retries_per_index=retries_per_index,
                  node_selector=node_selector, env=env),
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime",
        "metadata": _runtime_metadata(name, namespace),
        "spec": {
            "mlPolicy": {"numNodes": num_nodes, "torch": {}},
            "template": {"spec": _jobset_spec(max_restarts=max_restarts, codes=codes,
                                              replicated_jobs=replicated_jobs)},
        },
    }


def _check_runtime_arguments(*, max_restarts: int, retries_per_index: int, gpus_per_node: int, efa_per_node: int,
                             num_nodes: int, pvc_name: str, env: Optional[dict[str, str]],
                             termination_grace_period_s: int, gpudirect_rdma: bool) -> None:
    """Raise ValueError, naming the argument and the fix, for arguments the runtime cannot honour."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts}: must be >= 0")
    if retries_per_index < 0:
        raise ValueError(f"retries_per_index={retries_per_index}: must be >= 0 (0 = gang restart on any failure)")
    if gpus_per_node < 0 or efa_per_node < 0:
        raise ValueError(f"gpus_per_node={gpus_per_node}, efa_per_node={efa_per_node}: must be >= 0")
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes}: must be >= 1")
    if not pvc_name:
        raise ValueError("pvc_name is required: checkpoints must be on shared storage to survive restarts")
    reserved = sorted(k for k in (env or {}) if k.startswith("PET_"))
    if reserved:
        raise ValueError(f"env {reserved}: PET_* variables are set by the Trainer torch plugin; remove them")
    if "JOBSET_NAME" in (env or {}):
        raise ValueError("env JOBSET_NAME: the runtime sets it from the pod's JobSet label; remove it")
    if termination_grace_period_s < 30:
        raise ValueError(f"termination_grace_period_s={termination_grace_period_s}: allow >= 30 s to checkpoint")
    if gpudirect_rdma and not (gpus_per_node and efa_per_node):
        raise ValueError("gpudirect_rdma=True needs GPUs and EFA (gpus_per_node and efa_per_node > 0)")


def _runtime_metadata(name: str, namespace: Optional[str]) -> dict[str, Any]:
    """The runtime's ``metadata``: its name, the torch framework label, and the namespace of a namespaced one."""
    metadata: dict[str, Any] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def _jobset_spec(*, max_restarts: int, codes: list[int], replicated_jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JobSet spec: done when every training pod has succeeded, gang restarts by the failure rules (up to
    ``max_restarts`` counted ones), and ``replicated_jobs`` in creation order."""
    return {
        # The store never completes: only the training pods decide success.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [NODE]},
        "failurePolicy": {
            "maxRestarts": max_restarts,
            "restartStrategy": "Recreate",
            "rules": _jobset_failure_rules(codes),
        },
        "replicatedJobs": replicated_jobs,
    }


def _jobset_failure_rules(codes: list[int]) -> list[dict[str, Any]]:
    """JobSet failurePolicy rules, first match wins; a Job failure no rule matches is RestartJobSet (counted)."""
    rules: list[dict[str, Any]] = []
    if codes:
        pattern = "|".join(str(c) for c in codes)
        rules.append({
            "name": "NonRetryableExitCode",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            # The Job controller's message for a podFailurePolicy exit-code match.
            "onJobFailureMessagePatterns": [f"failed with exit code ({pattern}) matching FailJob rule"],
            "targetReplicatedJobs": [NODE],
        })
    rules += [
        {
            # A training pod failed more often than backoffLimitPerIndex allows: per-index retry gave up.
            "name": "NodeRetriesExhausted",
            "action": "RestartJobSet",
            "onJobFailureReasons": ["MaxFailedIndexesExceeded", "FailedIndexes", "BackoffLimitExceeded"],
            "targetReplicatedJobs": [NODE],
        },
        {
            # The store pod was evicted/preempted: infrastructure churn does not use the job's budget.
            "name": "StoreDisrupted",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": ["condition DisruptionTarget matching FailJob rule"],
            "targetReplicatedJobs": [STORE],
        },
        {
            # The store died: the rendezvous state is gone and every agent's connection with it.
            "name": "StoreLost",
            "action": "RestartJobSet",
            "targetReplicatedJobs": [STORE],
        },
    ]
    return rules


def _store_job(image: str, node_selector: Optional[dict[str, str]]) -> dict[str, Any]:
    """The ``store`` replicated job: one CPU pod serving the c10d rendezvous store until the JobSet ends."""
    container: dict[str, Any] = {
        "name": STORE,
        "image": image,
        # --job-id: the store answers only agents of this job (the same string as the node pods' T5_RDZV_ID).
        "command": ["python", "-m", "training.rdzv_store", "--host", "0.0.0.0", "--port", str(STORE_PORT),
                    "--job-id", RDZV_ID],
        "env": [_jobset_name_env(), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "rdzv", "containerPort": STORE_PORT, "protocol": "TCP"}],
        # Ready = accepting connections: the node Job waits for it (dependsOn), so agents never race the store.
        "readinessProbe": {"tcpSocket": {"port": "rdzv"}, "periodSeconds": 2, "failureThreshold": 3},
        "resources": {k: dict(v) for k, v in STORE_RESOURCES.items()},
    }
    pod_spec: dict[str, Any] = {
        # Never + backoffLimit 0: a store that stopped is a lost rendezvous; the JobSet restarts everything.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": STORE_GRACE_S,
        "containers": [container],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    return {
        "name": STORE,
        "replicas": 1,
        "template": {
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [
                    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]},
                "template": {
                    "metadata": {"labels": {COMPONENT_LABEL: RDZV_STORE_COMPONENT}},
                    "spec": pod_spec,
                },
            },
        },
    }


def _node_job(*, image: str, pvc_name: str, gpus_per_node: int, efa_per_node: int, gpudirect_rdma: bool,
              fsx_mount_path: str, shm_size: str, grace_s: int, codes: list[int], retries_per_index: int,
              node_selector: Optional[dict[str, str]], env: Optional[dict[str, str]]) -> dict[str, Any]:
    """The ``node`` replicated job: the training pods, each retried alone (see the module doc)."""
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
        # JOBSET_NAME first: $(VAR) references only see variables defined earlier in the list.
        "env": [_jobset_name_env(),
                {"name": "T5_RDZV_ENDPOINT", "value": RDZV_ENDPOINT},
                {"name": "T5_RDZV_ID", "value": RDZV_ID},
                *({"name": k, "value": v} for k, v in container_env.items())],
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
        "restartPolicy": "Never",  # required by podFailurePolicy and backoffLimitPerIndex
        "terminationGracePeriodSeconds": grace_s,
        "containers": [container],
        "volumes": [
            {"name": "fsx", "persistentVolumeClaim": {"claimName": pvc_name}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
            # The in-memory snapshots must outlive the pod: a replaced or gang-restarted pod is a new pod, and
            # an emptyDir would go with the old one. The node's tmpfs keeps them for the next pod there.
            {"name": "snapshots", "hostPath": {"path": NODE_MEMORY_DIR, "type": "DirectoryOrCreate"}},
        ],
    }
    if gpus_per_node:
        pod_spec["tolerations"] = [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)

    rules: list[dict[str, Any]] = []
    if codes:
        rules.append({"action": "FailJob",
                      "onExitCodes": {"containerName": NODE, "operator": "In", "values": codes}})
    # Infrastructure took the pod away: replace it without using the index's retries.
    rules.append({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})
    # Anything else (a crash, a lost node, an OOM kill, a deleted pod) counts towards backoffLimitPerIndex.

    return {
        "name": NODE,
        "replicas": 1,
        "dependsOn": [{"name": STORE, "status": "Ready"}],
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
            "spec": {
                "completionMode": "Indexed",
                "backoffLimitPerIndex": retries_per_index,
                # The first index out of retries fails the Job at once: the others could not train without it.
                "maxFailedIndexes": 0,
                # A replacement starts only when the old pod is gone: one agent per index and hostname.
                "podReplacementPolicy": "Failed",
                "podFailurePolicy": {"rules": rules},
                "template": {
                    "metadata": {"labels": {COMPONENT_LABEL: TRAINING_COMPONENT}},
                    "spec": pod_spec,
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


def replicated_job(runtime: dict[str, Any], name: str) -> dict[str, Any]:
    """The replicated job ``name`` of a rendered runtime (KeyError naming the jobs there if absent)."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    for rj in jobs:
        if rj["name"] == name:
            return rj
    raise KeyError(f"runtime {runtime['metadata']['name']!r} has no replicated job {name!r} "
                   f"(it has {[rj['name'] for rj in jobs]})")


def container_images(runtime: dict[str, Any]) -> dict[str, str]:
    """``"<replicated job>/<container>"`` -> image, for every container (init containers too) of a rendered or
    installed runtime: every image a job on it pulls, besides the TrainJob's own ``spec.trainer.image``, which
    replaces the ``node`` container's."""
    images: dict[str, str] = {}
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            images[f"{rj['name']}/{c['name']}"] = c.get("image", "")
    return images

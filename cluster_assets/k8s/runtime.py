"""The fault-tolerant Kubeflow Trainer runtime for the T5 job, as a plain Kubernetes object (a dict).

Pure function, no CDK or cluster access: the EKS stack installs what it returns, and tests (or an offline
emulator) can render and inspect the exact same object. Targets the Trainer v2.2+/v2.3 API
(``trainer.kubeflow.org/v1alpha1``) with JobSet v1alpha2 (v0.12) underneath and batch/v1 Jobs below that.

One replicated job, ``node`` (label ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``): the training pods.
The Trainer sets ``parallelism = completions = numNodes`` and injects ``PET_*`` into container ``node``;
``completionMode: Indexed`` (JobSet's webhook defaults it, rendered explicitly because per-index retry requires it)
gives each pod its index (``PET_NODE_RANK``) and the stable hostname ``<job>-node-0-<index>``.

Membership (the rendezvous) lives in the cluster's 3-member etcd (:mod:`cluster_assets.k8s.etcd`, installed by the
stack), not in any pod of the job: losing any one member, the leader included, costs no restart. The runtime gives
every training pod what the launcher needs to use it (``training.launch.from_env``: ``T5_ETCD_ENDPOINTS`` switches it
to the etcd coordinator): ``T5_ETCD_ENDPOINTS`` (the members' stable names), ``T5_ETCD_CA`` / ``T5_ETCD_CERT`` /
``T5_ETCD_KEY`` (Secret ``etcd-client``, the agents' client certificate, mounted read-only) and
``T5_RDZV_ID=trainjob-$(JOBSET_NAME)-a$(JOBSET_RESTART_ATTEMPT)`` (``JOBSET_NAME`` and ``JOBSET_RESTART_ATTEMPT``
from the pod's JobSet labels through the downward API: a gang restart starts a fresh rendezvous, while a pod the
Job controller replaces joins the running one). Which etcd user a job logs in as, and its key prefix, is the
TrainJob's (:mod:`cluster_assets.k8s.trainjob`: ``T5_ETCD_USER``, ``T5_ETCD_PREFIX`` and its password Secret, made
by the submit step).

How a failure is handled (the reason for every field below):

* A training pod fails (crash, OOM, lost node, ``kubectl delete pod``: exit != 0) -> batch/v1 per-index retry:
  ``backoffLimitPerIndex`` (default 3) lets the Job controller recreate *that index's pod only*, same hostname
  (``podReplacementPolicy: Failed``: the new pod is created once the old one is gone, never two agents for one
  index). The survivors' torchrun agents lose a peer, restart their workers and wait in the rendezvous (the store
  is elsewhere, so any pod, node 0's included, may die); the replacement joins, the round re-forms and training
  resumes from the newest checkpoint. No JobSet restart, the other pods keep running.
* A pod evicted or preempted by the infrastructure (pod condition ``DisruptionTarget``: drain, spot reclaim,
  node auto-repair): ``podFailurePolicy`` action ``Ignore`` replaces it without using the index's retries.
* A pod whose worker group the commit fence stopped (exit :data:`FENCED_EXIT_CODE`, 9: a newer rendezvous round
  replaced its group while it trained on, :mod:`training.checkpoint.fence`; the agent passes the code through):
  ``podFailurePolicy`` action ``Ignore``. The job is not failing, it goes on in the newer round, so neither
  ``FailJob`` (it would end the TrainJob that the newer group is training) nor a counted failure (it would use up
  that index's retries and, past them, gang-restart the newer group) is right: the Job controller replaces the pod,
  which joins the running rendezvous as a late node (a hot spare until the next round). It cannot loop: a group is
  fenced only after etcd formed a newer round without it, and the replacement waits in the rendezvous, where no
  commit (so no fence) happens.
* Exit codes that a restart cannot fix (:data:`NON_RETRYABLE_EXIT_CODES`): ``podFailurePolicy`` ``FailJob``
  -> Job failed (reason ``PodFailurePolicy``) -> JobSet ``failurePolicy`` rule ``NonRetryableExitCode``
  (``FailJobSet``) -> the TrainJob fails without looping.
* Fallback, JobSet gang restart (``failurePolicy.maxRestarts``, ``restartStrategy: Recreate``: every pod
  recreated, the training package resumes from the newest complete checkpoint on FSx): an index fails more than
  ``backoffLimitPerIndex`` times -> ``maxFailedIndexes: 0`` fails the node Job at once (reason
  ``MaxFailedIndexesExceeded``; without it the other indexes would wait in the rendezvous until their join
  timeout) -> rule ``NodeRetriesExhausted`` (``RestartJobSet``, counted). The membership store needs no rule of
  its own: an etcd member lost (crash, drain, node gone) is no Job failure at all.
* Success: JobSet ``successPolicy`` ``{operator: All, targetReplicatedJobs: [node]}``: the JobSet (and the
  TrainJob) completes when every node pod has succeeded.
* The in-memory snapshots (``training.checkpoint.memory``) live in the node's ``/dev/shm/t5-failover`` (a hostPath),
  not in the pod: a pod recreated on the same node restores from them (or a lost node's shards from its peer's
  replica) instead of going back to the storage checkpoint.
* ``ttlSecondsAfterFinished`` is deliberately not set (kubeflow/trainer#3737: restart-count reset loop).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from cluster_assets.k8s import etcd
from cluster_facts import (
    FSX_MOUNT_PATH,
    GPU_TAINT_KEY,
    IDENTICAL_WORKERS_ENV,
    MEMORY_DIR_ENV,
    NODE_MEMORY_DIR,
    RDZV_ENV,
    nccl_env,
    platform_timeouts,
)
from cluster_facts.names import COMPONENT_LABEL, TRAINING_COMPONENT

API_VERSION = "trainer.kubeflow.org/v1alpha1"
#: The replicated job and container the Trainer torch plugin injects PET_* variables into.
NODE = "node"
#: Label JobSet puts on every pod it creates, naming its JobSet (= the TrainJob's name).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Label JobSet puts on every pod it creates: the JobSet's restart attempt (0, then +1 per gang restart).
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: ``$(VAR)`` is expanded by the kubelet from the env vars of that name (listed before their users). One rendezvous
#: per JobSet attempt: a gang restart never meets the previous attempt's rounds.
RDZV_ID = "trainjob-$(JOBSET_NAME)-a$(JOBSET_RESTART_ATTEMPT)"
#: The agents' etcd client material (Secret etcd.CLIENT_SECRET) in container ``node``.
ETCD_CLIENT_VOLUME = "etcd-client"
#: Exit codes of ``python -m training`` that no restart can fix: 2 bad config, data or device, 3 checkpoint of
#: another model, 4 checkpoint of a run with other settings, 5 diverged (a rerun replays the same steps),
#: 7 checkpoint.dir held by another run. 6 (storage) stays retryable: space may be freed meanwhile.
NON_RETRYABLE_EXIT_CODES = (2, 3, 4, 5, 7)
#: Exit code of a pod whose worker group the commit fence stopped (``training.errors.StaleGroup``: a newer round
#: replaced it); ``podFailurePolicy`` ``Ignore``: replaced without using a retry (see the module doc).
FENCED_EXIT_CODE = 9
#: Failures of one training pod (one index) the Job controller retries before the JobSet restarts the gang.
DEFAULT_RETRIES_PER_INDEX = 3
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
#: Where the node's snapshot directory (cluster_facts.NODE_MEMORY_DIR, a hostPath) appears in the pod.
SNAPSHOT_MOUNT_PATH = "/var/run/t5-failover/memory"


def _label_env(name: str, label: str) -> dict[str, Any]:
    """An env var the kubelet fills from one of the pod's labels (downward API)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def etcd_env(namespace: str = etcd.ETCD_NAMESPACE) -> dict[str, str]:
    """The cluster's etcd as every agent reaches it: its members and the client material's files."""
    return {
        "T5_ETCD_ENDPOINTS": ",".join(etcd.endpoints(namespace)),
        "T5_ETCD_CA": f"{etcd.CLIENT_MOUNT}/{etcd.CA_CERT}",
        "T5_ETCD_CERT": f"{etcd.CLIENT_MOUNT}/{etcd.CLIENT_CERT}",
        "T5_ETCD_KEY": f"{etcd.CLIENT_MOUNT}/{etcd.CLIENT_KEY}",
    }


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
    env: Optional[dict[str, str]] = None,
    etcd_namespace: str = etcd.ETCD_NAMESPACE,
) -> dict[str, Any]:
    """Render the fault-tolerant torch runtime (the ``node`` replicated job, see the module doc).

    Args:
        name: object name (a DNS-1123 label); TrainJobs reference it in ``spec.runtimeRef.name``.
        pvc_name: PersistentVolumeClaim of the shared file system (FSx for Lustre), mounted at
            ``fsx_mount_path`` in every training pod; checkpoints must live there to survive restarts.
        image: default training image (a TrainJob may override it in ``spec.trainer.image``).
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
        non_retryable_exit_codes: container exit codes that fail the TrainJob without restarting
            (:data:`FENCED_EXIT_CODE` is refused: a fenced group is no failure of the job).
        retries_per_index: ``backoffLimitPerIndex`` of the node Job: counted failures of one training pod that
            the Job controller replaces alone; one more fails the node Job and the JobSet restarts the gang.
            0 = every training pod failure is a gang restart.
        node_selector: optional node labels the training pods must match (e.g. the GPU node group's label).
        env: extra environment for the ``node`` container. ``PET_*`` names are reserved for the Trainer.
        etcd_namespace: namespace of the cluster's etcd members (their names in ``T5_ETCD_ENDPOINTS``).

    Returns:
        A JSON-serialisable dict, ready for ``kubectl apply`` or CDK ``add_manifest``.
    """
    _check_runtime_arguments(
        max_restarts=max_restarts,
        retries_per_index=retries_per_index,
        gpus_per_node=gpus_per_node,
        efa_per_node=efa_per_node,
        num_nodes=num_nodes,
        pvc_name=pvc_name,
        env=env,
        termination_grace_period_s=termination_grace_period_s,
        gpudirect_rdma=gpudirect_rdma,
        non_retryable_exit_codes=non_retryable_exit_codes,
    )
    codes = sorted(set(non_retryable_exit_codes))
    replicated_jobs = [
        _node_job(
            image=image,
            pvc_name=pvc_name,
            gpus_per_node=gpus_per_node,
            efa_per_node=efa_per_node,
            gpudirect_rdma=gpudirect_rdma,
            fsx_mount_path=fsx_mount_path,
            shm_size=shm_size,
            grace_s=termination_grace_period_s,
            codes=codes,
            retries_per_index=retries_per_index,
            node_selector=node_selector,
            env=env,
            etcd_namespace=etcd_namespace,
        ),
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime",
        "metadata": _runtime_metadata(name, namespace),
        "spec": {
            "mlPolicy": {"numNodes": num_nodes, "torch": {}},
            "template": {"spec": _jobset_spec(max_restarts=max_restarts, codes=codes, replicated_jobs=replicated_jobs)},
        },
    }


def _check_runtime_arguments(
    *,
    max_restarts: int,
    retries_per_index: int,
    gpus_per_node: int,
    efa_per_node: int,
    num_nodes: int,
    pvc_name: str,
    env: Optional[dict[str, str]],
    termination_grace_period_s: int,
    gpudirect_rdma: bool,
    non_retryable_exit_codes: Sequence[int],
) -> None:
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
    owned = sorted(
        k for k in (env or {}) if k in ("JOBSET_NAME", "JOBSET_RESTART_ATTEMPT", "T5_RDZV_ID") or k in etcd_env()
    )
    if owned:
        raise ValueError(
            f"env {owned}: the runtime sets them (the pod's JobSet labels, the cluster's etcd); remove them"
        )
    if FENCED_EXIT_CODE in non_retryable_exit_codes:
        raise ValueError(
            f"non_retryable_exit_codes {sorted(set(non_retryable_exit_codes))}: {FENCED_EXIT_CODE} is a worker group "
            "the commit fence stopped while the job goes on in a newer round, never a job failure; remove it"
        )
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
        rules.append(
            {
                "name": "NonRetryableExitCode",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                # The Job controller's message for a podFailurePolicy exit-code match.
                "onJobFailureMessagePatterns": [f"failed with exit code ({pattern}) matching FailJob rule"],
                "targetReplicatedJobs": [NODE],
            }
        )
    rules += [
        {
            # A training pod failed more often than backoffLimitPerIndex allows: per-index retry gave up.
            "name": "NodeRetriesExhausted",
            "action": "RestartJobSet",
            "onJobFailureReasons": ["MaxFailedIndexesExceeded", "FailedIndexes", "BackoffLimitExceeded"],
            "targetReplicatedJobs": [NODE],
        },
    ]
    return rules


def _node_job(
    *,
    image: str,
    pvc_name: str,
    gpus_per_node: int,
    efa_per_node: int,
    gpudirect_rdma: bool,
    fsx_mount_path: str,
    shm_size: str,
    grace_s: int,
    codes: list[int],
    retries_per_index: int,
    node_selector: Optional[dict[str, str]],
    env: Optional[dict[str, str]],
    etcd_namespace: str,
) -> dict[str, Any]:
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
        # The label variables first: $(VAR) references only see variables defined earlier in the list.
        "env": [
            _label_env("JOBSET_NAME", JOBSET_NAME_LABEL),
            _label_env("JOBSET_RESTART_ATTEMPT", RESTART_ATTEMPT_LABEL),
            {"name": "T5_RDZV_ID", "value": RDZV_ID},
            *({"name": k, "value": v} for k, v in (etcd_env(etcd_namespace) | container_env).items()),
        ],
        "volumeMounts": [
            {"name": "fsx", "mountPath": fsx_mount_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "snapshots", "mountPath": SNAPSHOT_MOUNT_PATH},
            {"name": ETCD_CLIENT_VOLUME, "mountPath": etcd.CLIENT_MOUNT, "readOnly": True},
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
            # CA + client certificate of the agents (made by the stack's etcd-bootstrap Job); read by root only.
            {"name": ETCD_CLIENT_VOLUME, "secret": {"secretName": etcd.CLIENT_SECRET, "defaultMode": 0o400}},
        ],
    }
    if gpus_per_node:
        pod_spec["tolerations"] = [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)

    # A fenced worker group (exit 9): the job goes on in a newer round; the pod is replaced, uncounted, and rejoins
    # the rendezvous as a late node (see the module doc).
    rules: list[dict[str, Any]] = [
        {"action": "Ignore", "onExitCodes": {"containerName": NODE, "operator": "In", "values": [FENCED_EXIT_CODE]}}
    ]
    if codes:
        rules.append({"action": "FailJob", "onExitCodes": {"containerName": NODE, "operator": "In", "values": codes}})
    # Infrastructure took the pod away: replace it without using the index's retries.
    rules.append({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})
    # Anything else (a crash, a lost node, an OOM kill, a deleted pod) counts towards backoffLimitPerIndex.

    return {
        "name": NODE,
        "replicas": 1,
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
    """Environment every training pod gets: torchrun's (:mod:`cluster_facts.torchrun_env`), and on GPU pods the
    NCCL/EFA environment shared with the Slurm batch script (:func:`cluster_facts.nccl_env`)."""
    env = {
        # The launcher sets torchrun's environment as well; the runtime sets it for any TrainJob that runs
        # torchrun itself instead of the launcher. Identical workers: a TrainJob has one numProcPerNode for all
        # its pods, which run on one GPU instance type. (Slurm jobs always go through the launcher, so the batch
        # script does not need either.)
        **RDZV_ENV,
        **IDENTICAL_WORKERS_ENV,
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
    raise KeyError(
        f"runtime {runtime['metadata']['name']!r} has no replicated job {name!r} (it has {[rj['name'] for rj in jobs]})"
    )


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

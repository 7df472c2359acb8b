"""Build the Kubeflow Trainer v2.3 ``TrainJob`` that runs the T5 job on our ``ClusterTrainingRuntime``.

The TrainJob is built with the typed models of ``kubeflow-trainer-api`` (pinned to the Trainer line the EKS
stack installs) and checked by a lossless round trip (:mod:`cluster_assets.k8s.schema`).

What the rendered object says, and why:

* ``runtimeRef``: our fault-tolerant ``ClusterTrainingRuntime`` (a rendezvous store job, per-index retry of a
  failed training pod, JobSet gang restart as the fallback, FSx volume, ``/dev/shm``, EFA). The runtime owns the
  failure semantics and the rendezvous endpoint (``T5_RDZV_ENDPOINT``); the TrainJob only says what to run and
  how big.
* ``command``: ``python -m training.launch --from-env pet --min-nodes $(PET_NNODES) --train-timeout-s T
  --shutdown-timeout S --join-timeout J --``, with T, S, J from the EKS row of :data:`cluster_facts.TIMEOUTS`
  (the process-group timeout after step 1; the agent's wait for its workers to checkpoint, which the
  runtime's pod grace period exceeds; the rendezvous wait for a pod scheduled on a replacement GPU node to
  pull the image). The launcher maps the ``PET_*`` variables the Trainer torch plugin injects to torchrun
  (c10d rendezvous on the runtime's store job with the tuned timeouts, ``--max-restarts`` for worker crashes
  inside a pod). ``$(PET_NNODES)`` is expanded by the kubelet from the container env: MIN = MAX nodes, because
  on Kubernetes a lost pod is replaced (per-index retry, or a gang restart), and a fixed world size keeps resume
  bitwise exact.
* ``args``: the training module's arguments: preset, a per-job directory on the FSx volume
  (``<mount>/jobs/<name>``: checkpoints + metrics, so a re-submitted job of the same name resumes), then
  the user's overrides (last wins).
* ``resourcesPerNode``: GPUs and EFA interfaces per node (+ the hugepages EFA needs); ``numNodes``,
  ``numProcPerNode`` (one worker per GPU).
* the job's etcd identity: ``T5_ETCD_USER`` (``job-<name>``), ``T5_ETCD_PREFIX`` (``/t5-failover/jobs/<name>/``)
  and ``T5_ETCD_PASSWORD_FILE``, the password in Secret ``<name>-etcd`` (made by the submit step's add-job Job just
  before the TrainJob, :func:`cluster_assets.k8s.etcd.add_job_job`), which a ``runtimePatches`` entry mounts into
  container ``node`` (the runtime is shared by every job and cannot name a job's Secret). The cluster's endpoints
  and the client certificate come from the runtime.
* hot spares (``spares`` K > 0): ``numNodes`` = nodes + K and ``T5_SPARES=K``; every pod runs the same launcher,
  the job trains on ``--min-nodes`` = MAX = nodes, and the K agents left over wait in the rendezvous (torch's
  redundancy list). When a training pod or its node is lost, a spare takes its place in the next round (seconds)
  instead of the job waiting for the Job controller's replacement pod, which joins as the new spare once
  Kubernetes has created and scheduled it (minutes after a crashed node). Which pods train is decided by join
  order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubeflow_trainer_api import models as m

from cluster_assets.k8s import etcd, schema
from cluster_facts import platform_timeouts
from training.launch.rendezvous.admin import JOBS_PREFIX, job_user

#: 2 MiB hugepages the EFA libfabric provider needs per pod (AWS EFA-on-EKS guidance).
EFA_HUGEPAGES = "5120Mi"
#: Environment names the Trainer torch plugin owns; v2.3's webhook rejects them in ``trainer.env``.
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
#: Name rule: a DNS-1035 label, short enough that ``<name>-node-0-<index>`` (pod hostname) stays <= 63.
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LEN = 40
#: The launcher's hot-spare count (``training.launch.from_env``), set from ``spares``.
SPARES_ENV = "T5_SPARES"
#: Set by the runtime or from the job's etcd identity: a TrainJob's --env may not replace them.
OWNED_ENV = (
    "T5_RDZV_ID",
    "T5_RDZV_ENDPOINT",
    "JOBSET_NAME",
    "JOBSET_RESTART_ATTEMPT",
    "T5_ETCD_ENDPOINTS",
    "T5_ETCD_CA",
    "T5_ETCD_CERT",
    "T5_ETCD_KEY",
    "T5_ETCD_USER",
    "T5_ETCD_PASSWORD_FILE",
    "T5_ETCD_PREFIX",
)
#: ``runtimePatches[].manager`` of the patch that mounts the job's etcd Secret.
PATCH_MANAGER = "t5-failover.io/submit"
ETCD_JOB_VOLUME = "etcd-job"
LABEL_APP = "app.kubernetes.io/part-of"
LABEL_PRESET = "t5-failover/preset"


class TrainJobError(ValueError):
    """An invalid TrainJob setting. The message names the value and the fix."""


@dataclass(frozen=True, kw_only=True)
class TrainJobConfig:
    """Everything that decides the rendered TrainJob.

    Attributes:
        name: TrainJob name (also the JobSet name and the per-job directory on FSx).
        namespace: namespace to create it in (where the FSx PVC lives).
        image: training image (the stack's ECR repository URI with a tag).
        runtime_name: the ClusterTrainingRuntime to run on (ours, installed by the EKS stack).
        fsx_mount_path: where the runtime mounts the FSx volume in container ``node``.
        num_nodes: pods (= GPU nodes) that train.
        spares: hot-spare pods beyond ``num_nodes`` (each on its own GPU node): they wait in the rendezvous and
            take a lost pod's place in seconds, keeping the world size (0 = none).
        nproc_per_node: worker processes per pod (one per GPU on GPU nodes).
        gpus_per_node: ``nvidia.com/gpu`` per pod (0 for a CPU-only job).
        efa_per_node: ``vpc.amazonaws.com/efa`` interfaces per pod (0: no EFA, no hugepages).
        cpu_request: CPU request per pod ("" = none); a floor for scheduling, not a limit.
        memory_request: memory request per pod ("" = none); required by Kubernetes with hugepages.
        preset: training preset (``training/presets/<preset>.toml``).
        training_args: extra training overrides (``--section.field value`` ...), applied last.
        launcher_args: extra ``training.launch`` options (e.g. ``--max-restarts 5``).
        env: extra container environment (name, value) pairs; ``PET_*`` are reserved.
        labels: extra TrainJob labels.
    """

    name: str
    namespace: str = "default"
    image: str
    runtime_name: str
    fsx_mount_path: str
    num_nodes: int = 2
    spares: int = 0
    nproc_per_node: int = 8
    gpus_per_node: int = 8
    efa_per_node: int = 32
    cpu_request: str = ""
    memory_request: str = "64Gi"
    preset: str = "t5-base"
    training_args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = field(default=())

    @property
    def job_dir(self) -> str:
        """Per-job directory on the FSx volume: checkpoints and metrics of this TrainJob name."""
        return f"{self.fsx_mount_path.rstrip('/')}/jobs/{self.name}"

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node


_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def check(cfg: TrainJobConfig) -> None:
    """Every check on the settings, with the fix in the message."""
    if not NAME_RE.match(cfg.name) or len(cfg.name) > MAX_NAME_LEN:
        raise TrainJobError(
            f"name {cfg.name!r} is not valid: use lower-case letters, digits and '-', starting with a letter, "
            f"at most {MAX_NAME_LEN} characters (pod hostnames are <name>-node-0-<index>)"
        )
    if not NAME_RE.match(cfg.namespace) or len(cfg.namespace) > 63:
        raise TrainJobError(f"namespace {cfg.namespace!r} is not a valid Kubernetes namespace name")
    if not cfg.image or any(c.isspace() for c in cfg.image):
        raise TrainJobError(
            f"image {cfg.image!r} is empty or has spaces: pass --image <ECR URI>:<tag> "
            "(the stack output EcrRepositoryUri plus the tag `make image` pushed)"
        )
    if not cfg.runtime_name:
        raise TrainJobError("runtime name is empty: pass --runtime (the stack installs our ClusterTrainingRuntime)")
    if not cfg.fsx_mount_path.startswith("/"):
        raise TrainJobError(f"FSx mount path {cfg.fsx_mount_path!r} must be absolute")
    # GPUs and EFA before the workers: the submit derives --nproc-per-node from --gpus-per-node, so a bad GPU count
    # must be reported as the flag the user typed
    for what, v, lo in (
        ("--nodes", cfg.num_nodes, 1),
        ("--spares", cfg.spares, 0),
        ("--gpus-per-node", cfg.gpus_per_node, 0),
        ("--efa-per-node", cfg.efa_per_node, 0),
        ("--nproc-per-node", cfg.nproc_per_node, 1),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise TrainJobError(f"{what} {v!r} is invalid: must be an integer >= {lo}")
    if cfg.gpus_per_node and cfg.nproc_per_node > cfg.gpus_per_node:
        raise TrainJobError(
            f"--nproc-per-node {cfg.nproc_per_node} > --gpus-per-node {cfg.gpus_per_node}: each worker needs "
            f"its own GPU; use --nproc-per-node {cfg.gpus_per_node} (or fewer)"
        )
    for what, q in (("--cpu", cfg.cpu_request), ("--memory", cfg.memory_request)):
        if q and not _QUANTITY_RE.match(q):
            raise TrainJobError(f"{what} {q!r} is not a Kubernetes quantity (e.g. 16, 500m, 64Gi)")
    if cfg.efa_per_node and not cfg.memory_request:
        raise TrainJobError(
            "EFA needs hugepages, and Kubernetes requires a memory request with hugepages: "
            "pass --memory (e.g. 64Gi) or --efa-per-node 0"
        )
    for name, _ in cfg.env:
        if name == SPARES_ENV:
            raise TrainJobError(f"env {name} is set from --spares (the pods beyond --nodes): pass --spares instead")
        if name in OWNED_ENV:
            raise TrainJobError(
                f"env {name} is set by the runtime or the job's etcd credentials (each TrainJob "
                "logs in to the cluster's etcd as its own user): remove it"
            )
        if name in RESERVED_ENV:
            raise TrainJobError(
                f"env {name} is reserved: the Trainer torch plugin sets it (and v2.3 rejects "
                "TrainJobs that set it); change --nodes/--nproc-per-node instead"
            )
        if not name or "=" in name:
            raise TrainJobError(f"env name {name!r} is invalid")
    for a in cfg.training_args:
        if a in ("--job.out_dir", "--checkpoint.dir", "--metrics.path") or a.split("=")[0] in (
            "--job.out_dir",
            "--checkpoint.dir",
            "--metrics.path",
        ):
            raise TrainJobError(
                f"{a.split('=')[0]} is set per job on FSx ({cfg.job_dir}); to resume or reuse a "
                "job's checkpoints, submit with the same --name instead"
            )


def node_command(cfg: TrainJobConfig) -> tuple[list[str], list[str]]:
    """(command, args) of container ``node``: the launcher in PET mode, then the training arguments."""
    t = platform_timeouts("eks")
    # The EKS timeouts (cluster_facts.TIMEOUTS): hang detection after step 1, the agent's wait for a
    # checkpoint-on-SIGTERM (the runtime's pod grace period exceeds it), and the rendezvous wait for a pod on a
    # fresh GPU node that pulls a multi-GB image first (shorter, and the pods already running would give up
    # and force another restart). launcher_args come later, so a user's own value wins (argparse: last counts).
    # MIN = MAX = the training pods: $(PET_NNODES) (numNodes, as the kubelet expands it) counts the spares too
    min_nodes = str(cfg.num_nodes) if cfg.spares else "$(PET_NNODES)"
    command = [
        "python",
        "-m",
        "training.launch",
        "--from-env",
        "pet",
        "--min-nodes",
        min_nodes,
        "--train-timeout-s",
        str(t.train_pg_timeout_s),
        "--shutdown-timeout",
        str(t.shutdown_timeout_s),
        "--join-timeout",
        str(t.rdzv_join_timeout_s),
        *cfg.launcher_args,
        "--",
    ]
    args = ["--preset", cfg.preset, "--job.out_dir", cfg.job_dir, *cfg.training_args]
    return command, args


def resources(cfg: TrainJobConfig) -> dict[str, dict[str, str]]:
    """``resourcesPerNode``: GPUs + EFA (+ hugepages) as limits = requests; CPU/memory as requests only."""
    limits: dict[str, str] = {}
    if cfg.gpus_per_node:
        limits["nvidia.com/gpu"] = str(cfg.gpus_per_node)
    if cfg.efa_per_node:
        limits["vpc.amazonaws.com/efa"] = str(cfg.efa_per_node)
        limits["hugepages-2Mi"] = EFA_HUGEPAGES
    requests = dict(limits)  # extended resources and hugepages: requests must equal limits
    if cfg.cpu_request:
        requests["cpu"] = cfg.cpu_request
    if cfg.memory_request:
        requests["memory"] = cfg.memory_request
    out = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def etcd_identity_env(cfg: TrainJobConfig) -> dict[str, str]:
    """The job's etcd user, its key prefix, and where its password is mounted (see the module docstring)."""
    return {
        "T5_ETCD_USER": job_user(cfg.name),
        "T5_ETCD_PREFIX": f"{JOBS_PREFIX}{cfg.name}/",
        "T5_ETCD_PASSWORD_FILE": f"{etcd.JOB_MOUNT}/{etcd.PASSWORD}",
    }


def etcd_secret_patch(cfg: TrainJobConfig) -> m.TrainerV1alpha1RuntimePatch:
    """Mount the job's Secret (its etcd password) into container ``node`` of the training pods."""
    pod = m.TrainerV1alpha1PodSpecPatch(
        volumes=[
            m.IoK8sApiCoreV1Volume.from_dict(
                {
                    "name": ETCD_JOB_VOLUME,
                    "secret": {"secretName": etcd.job_secret_name(cfg.name), "defaultMode": 0o400},
                }
            )
        ],
        containers=[
            m.TrainerV1alpha1ContainerPatch(
                name="node",
                volume_mounts=[
                    m.IoK8sApiCoreV1VolumeMount(name=ETCD_JOB_VOLUME, mount_path=etcd.JOB_MOUNT, read_only=True)
                ],
            )
        ],
    )
    node = m.TrainerV1alpha1ReplicatedJobPatch(
        name="node",
        template=m.TrainerV1alpha1JobTemplatePatch(
            spec=m.TrainerV1alpha1JobSpecPatch(template=m.TrainerV1alpha1PodTemplatePatch(spec=pod))
        ),
    )
    return m.TrainerV1alpha1RuntimePatch(
        manager=PATCH_MANAGER,
        training_runtime_spec=m.TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=m.TrainerV1alpha1JobSetTemplatePatch(spec=m.TrainerV1alpha1JobSetSpecPatch(replicated_jobs=[node]))
        ),
    )


def build_train_job(cfg: TrainJobConfig) -> m.TrainerV1alpha1TrainJob:
    """The typed TrainJob model (validated settings, pinned API)."""
    check(cfg)
    command, args = node_command(cfg)
    spares = ((SPARES_ENV, str(cfg.spares)),) if cfg.spares else ()
    env = [
        m.IoK8sApiCoreV1EnvVar(name=k, value=v)
        for k, v in (("PYTHONUNBUFFERED", "1"), *spares, *etcd_identity_env(cfg).items(), *cfg.env)
    ]
    res = resources(cfg)
    labels = {LABEL_APP: "t5-failover", LABEL_PRESET: cfg.preset, **dict(cfg.labels)}
    return m.TrainerV1alpha1TrainJob(
        api_version=schema.API_VERSION,
        kind="TrainJob",
        metadata=m.IoK8sApimachineryPkgApisMetaV1ObjectMeta(name=cfg.name, namespace=cfg.namespace, labels=labels),
        spec=m.TrainerV1alpha1TrainJobSpec(
            runtime_ref=m.TrainerV1alpha1RuntimeRef(
                api_group=schema.API_GROUP, kind="ClusterTrainingRuntime", name=cfg.runtime_name
            ),
            trainer=m.TrainerV1alpha1Trainer(
                image=cfg.image,
                command=command,
                args=args,
                env=env,
                num_nodes=cfg.num_nodes + cfg.spares,
                num_proc_per_node=cfg.nproc_per_node,
                resources_per_node=m.IoK8sApiCoreV1ResourceRequirements.from_dict(res) if res else None,
            ),
            runtime_patches=[etcd_secret_patch(cfg)],
        ),
    )


def train_job_manifest(cfg: TrainJobConfig) -> dict[str, Any]:
    """The TrainJob as a plain dict, checked by a lossless round trip through the pinned models."""
    return schema.validate(build_train_job(cfg).to_dict())


def to_yaml(*docs: dict[str, Any]) -> str:
    """Multi-document YAML in field order (what ``kubectl apply -f -`` reads)."""
    return "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False) for d in docs)

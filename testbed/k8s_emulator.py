"""Offline contract emulator: run a rendered ClusterTrainingRuntime + TrainJob as local processes.

It reads the two objects exactly as they would be applied to the cluster and does what Kubeflow Trainer
v2.3, JobSet and the Job controller would do with them, with processes in place of pods:

* **Rendering (Trainer v2.3 torch plugin + JobSet builder)**: the replicated job labelled
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` (must be named ``node``) gets
  ``parallelism = completions = numNodes``; container ``node`` takes the TrainJob's image and command,
  args = TrainJob args followed by the runtime's args, env = runtime env, upserted with the TrainJob env,
  upserted with ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (from the Job completion index),
  ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``. ``$(VAR)`` references in env, command and args are expanded
  the way the kubelet does.
* **Pods**: one process per completion index, started with exactly that command and env, plus what the
  image would provide (``PATH`` with this venv's python/torchrun first, ``HOME``, ``HOSTNAME``). Working
  directory: the container's ``workingDir`` or the project root (stand-in for the image's WORKDIR).
* **Volumes**: every mount backed by a PersistentVolumeClaim (the FSx volume) maps to one local directory
  shared by all pods and restarts; ``emptyDir`` mounts map to a fresh per-pod directory. Paths under those
  mounts in command, args and env are rewritten to the local directories.
* **Failure semantics**: a container exit != 0 fails the pod; the Job's ``podFailurePolicy`` rules
  (``onExitCodes``, ``onPodConditions``) pick FailJob / Ignore / Count; Count past ``backoffLimit``
  (default 6, as in Kubernetes) fails the Job (BackoffLimitExceeded), otherwise that one pod is replaced.
  A failed Job terminates its other pods (SIGTERM to PID 1, SIGKILL to every process of the pod after
  ``terminationGracePeriodSeconds``, like the container runtime), then JobSet's ``failurePolicy`` rules
  decide: FailJobSet, RestartJobSet (counts towards ``maxRestarts``; past it the JobSet fails),
  RestartJobSetAndIgnoreMaxRestarts. No ``failurePolicy`` -> the first Job failure fails the JobSet
  (and the TrainJob). All pods succeeding completes the Job, the JobSet (successPolicy) and the TrainJob.

Deliberate differences from a cluster (printed in every report): ``PET_MASTER_ADDR`` resolves to
127.0.0.1 (all pods share this machine's network); ``PET_MASTER_PORT`` may be moved off 29500 so parallel
runs don't collide; the old pods of a restart are gone before the new ones start (Recreate on a cluster may
overlap them, each in its own network namespace); no scheduling, images, GPUs, EFA or resource limits.

    python -m testbed.k8s_emulator --runtime R.yaml --trainjob T.yaml --fsx-dir /tmp/fsx \
        [--fault kill:1@4] [--master-port 0] [--report report.json]
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

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_PORT = 29500  # constants.ContainerTrainerPort in Trainer v2.3
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes Job default
DEFAULT_GRACE_S = 30  # Kubernetes pod default terminationGracePeriodSeconds
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
class Rendered:
    """What Trainer + JobSet make of the pair: the ``node`` Job and its container, before per-pod values."""

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


def render(runtime: dict, trainjob: dict) -> Rendered:
    """Check the pair against the Trainer v2.3 contract and compute the ``node`` Job's pod template."""
    schema.roundtrip(runtime)
    schema.roundtrip(trainjob)
    if runtime["kind"] != "ClusterTrainingRuntime":
        raise ContractError(f"runtime kind {runtime['kind']!r}: the emulator runs a ClusterTrainingRuntime")
    ref = trainjob["spec"]["runtimeRef"]
    if ref.get("kind", "ClusterTrainingRuntime") != "ClusterTrainingRuntime" or \
            ref.get("apiGroup", schema.API_GROUP) != schema.API_GROUP:
        raise ContractError(f"TrainJob runtimeRef {ref} does not point at a ClusterTrainingRuntime")
    if ref["name"] != runtime["metadata"]["name"]:
        raise ContractError(f"TrainJob runtimeRef.name {ref['name']!r} != runtime name "
                            f"{runtime['metadata']['name']!r}: the cluster would report the runtime as missing")
    if trainjob["spec"].get("runtimePatches"):
        raise ContractError("TrainJob runtimePatches are not emulated; put pod settings in the runtime")
    rspec = runtime["spec"]
    ml = rspec.get("mlPolicy") or {}
    if "torch" not in ml:
        raise ContractError("runtime spec.mlPolicy.torch is missing: without it the Trainer injects no PET_* "
                            "variables and the launcher cannot find its peers")
    js = (rspec.get("template") or {}).get("spec") or {}
    rjobs = js.get("replicatedJobs") or []
    trainers = [r for r in rjobs if ((r["template"].get("metadata") or {}).get("labels") or {})
                .get(ANCESTOR_LABEL) == "trainer"]
    if len(trainers) != 1:
        raise ContractError(f"runtime needs exactly one replicated job labelled {ANCESTOR_LABEL}: trainer "
                            f"(found {len(trainers)})")
    rj = trainers[0]
    if rj["name"] != "node":
        raise ContractError(f"trainer replicated job is named {rj['name']!r}: Trainer v2.3 hard-codes "
                            f"PET_MASTER_ADDR=<job>-node-0-0.<job>, so it must be 'node'")
    if len(rjobs) != 1:
        raise ContractError(f"runtime has replicated jobs {[r['name'] for r in rjobs]}: the emulator runs only "
                            "'node' (initializers are not emulated)")
    jspec = rj["template"].get("spec") or {}
    if jspec.get("completionMode", "Indexed") != "Indexed":
        raise ContractError("node Job completionMode must be Indexed (JobSet's default): PET_NODE_RANK comes "
                            "from the completion index")
    pod = jspec["template"]
    pspec = pod.get("spec") or {}
    containers = [c for c in pspec.get("containers") or [] if c["name"] == "node"]
    if not containers:
        raise ContractError("the node Job's pod template has no container named 'node' (the one the Trainer "
                            "fills from the TrainJob and injects PET_* into)")
    if pspec.get("initContainers"):
        raise ContractError("initContainers are not emulated")
    ctr = containers[0]
    tr = trainjob["spec"].get("trainer") or {}
    num_nodes = tr.get("numNodes") or ml.get("numNodes") or 1
    if num_nodes < 1:
        raise ContractError(f"numNodes {num_nodes} < 1")
    job_name = trainjob["metadata"]["name"]

    command = list(tr["command"]) if tr.get("command") is not None else list(ctr.get("command") or [])
    args = list(ctr.get("args") or [])
    if tr.get("args") is not None:
        args = list(tr["args"]) + args  # v2.x JobSet builder: TrainJob args first, then the runtime's
    if not command:
        raise ContractError("container 'node' has no command (neither the TrainJob nor the runtime sets one); "
                            "the image entrypoint is not emulated")
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    bad = [e["name"] for e in tr.get("env") or [] if e["name"] in reserved]
    if bad:
        raise ContractError(f"TrainJob trainer.env sets reserved {bad}: the v2.3 webhook rejects it")
    env = _upsert(ctr.get("env") or [], tr.get("env") or [])
    env = _upsert(env, [
        {"name": "PET_NNODES", "value": str(num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": _nproc_per_node(tr)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
        {"name": "PET_MASTER_ADDR", "value": f"{job_name}-node-0-0.{job_name}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ])

    volumes = {v["name"]: v for v in pspec.get("volumes") or []}
    mounts: dict[str, str] = {}
    for vm in ctr.get("volumeMounts") or []:
        vol = volumes.get(vm["name"])
        if vol is None:
            raise ContractError(f"volumeMount {vm['name']!r} has no matching pod volume")
        if "persistentVolumeClaim" in vol:
            mounts[vm["mountPath"]] = "pvc"
        elif "emptyDir" in vol:
            mounts[vm["mountPath"]] = "emptyDir"
        else:
            mounts[vm["mountPath"]] = "emptyDir"  # hostPath/configMap...: a private local directory
    restart_policy = pspec.get("restartPolicy", "Always")
    if restart_policy not in ("Never", "OnFailure"):
        raise ContractError(f"pod restartPolicy {restart_policy!r}: a Job allows only Never or OnFailure")
    pfp = (jspec.get("podFailurePolicy") or {}).get("rules") or []
    if pfp and restart_policy != "Never":
        raise ContractError("a Job podFailurePolicy requires pod restartPolicy: Never")
    fp = js.get("failurePolicy")
    strategy = (fp or {}).get("restartStrategy", "Recreate")
    # Both recreate every pod; the emulator removes the old pods before it starts new ones, which satisfies both.
    if strategy not in ("Recreate", "BlockingRecreate"):
        raise ContractError(f"JobSet restartStrategy {strategy!r} is not emulated (Recreate, BlockingRecreate)")
    return Rendered(
        job_name=job_name, num_nodes=num_nodes, nproc_per_node=_nproc_per_node(tr), command=command + args,
        env=env, working_dir=ctr.get("workingDir"), mounts=mounts,
        backoff_limit=jspec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT), pod_failure_rules=pfp,
        restart_policy=restart_policy, grace_s=float(pspec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)),
        max_restarts=None if fp is None else fp.get("maxRestarts", 0), failure_rules=(fp or {}).get("rules") or [],
    )


# --------------------------------------------------------------------------------------- failure rules
def pod_failure_action(rules: list[dict], exit_code: int, conditions: set[str], pod: str) -> tuple[str, str]:
    """Job podFailurePolicy: (action, Job failure message) of the first matching rule, else Count.

    Messages are the Job controller's own (pkg/controller/job/pod_failure_policy.go), because JobSet
    failurePolicy rules match them with ``onJobFailureMessagePatterns``.
    """
    for i, r in enumerate(rules):
        oe, oc = r.get("onExitCodes"), r.get("onPodConditions")
        if oe:
            if oe.get("containerName") not in (None, "node") or exit_code == 0:
                continue
            if (oe["operator"] == "In") != (exit_code in set(oe["values"])):
                continue
            return r["action"], (f"Container node for pod {pod} failed with exit code {exit_code} matching "
                                 f"{r['action']} rule at index {i}")
        if oc:
            for pat in oc:
                if pat["type"] in conditions and pat.get("status", "True") in ("True", ""):
                    return r["action"], (f"Pod {pod} has condition {pat['type']} matching {r['action']} rule "
                                         f"at index {i}")
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
    """One emulated pod: a process tree started from container ``node``'s command."""

    name: str
    rank: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    proc: Any = None
    known: dict[int, str] = field(default_factory=dict)  # pid -> starttime, every process ever seen in it
    conditions: set[str] = field(default_factory=set)
    exit_code: int | None = None
    started: float = 0.0
    handled: bool = False  # the Job controller has acted on this pod's end

    def start(self) -> None:
        import subprocess
        self.log = open(self.log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
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
    condition a drain/eviction sets), on the pod of node ``rank`` once the job logged step ``at_step``."""

    kind: str
    rank: int
    at_step: int

    @classmethod
    def parse(cls, text: str) -> "Fault":
        m = re.fullmatch(r"(kill|delete|evict):(\d+)@(\d+)", text)
        if not m:
            raise argparse.ArgumentTypeError(f"fault {text!r}: expected KIND:RANK@STEP, e.g. kill:1@4 "
                                             "(KIND kill|delete|evict)")
        return cls(m.group(1), int(m.group(2)), int(m.group(3)))


@dataclass
class Event:
    time: float
    what: str
    detail: str = ""


class Emulator:
    """Runs the ``node`` Job of a rendered runtime + TrainJob with JobSet/Job failure semantics."""

    def __init__(self, runtime: dict, trainjob: dict, *, fsx_dir: str | Path, workdir: str | Path | None = None,
                 project_root: str | Path = PROJECT_ROOT, bin_dir: str | Path | None = None,
                 master_port: int = TRAINER_PORT, echo: Callable[[str], None] | None = print):
        self.r = render(runtime, trainjob)
        self.fsx_dir = Path(fsx_dir).resolve()
        self.fsx_dir.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="k8s-emu-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.project_root = Path(project_root).resolve()
        self.bin_dir = Path(bin_dir or Path(sys.executable).parent)
        self.master_port = master_port or _free_port()
        self.echo = echo or (lambda s: None)
        self.events: list[Event] = []
        self.fault_log: list[dict] = []  # {"label", "time", "step", "pod", "kind", "rank"} per injected fault
        self.restarts = 0
        self.restarts_towards_max = 0
        self.pod_failures = 0
        self.state = "Created"
        self.message = ""

    # ----------------------------------------------------------------------------------- pod rendering
    def _map_path(self, s: str, pod_dir: Path) -> str:
        """Rewrite paths under volume mounts to their local directories (longest mount first)."""
        for mount in sorted(self.r.mounts, key=len, reverse=True):
            local = self.fsx_dir if self.r.mounts[mount] == "pvc" else pod_dir / "volumes" / mount.strip("/")
            pat = re.compile(r"(^|(?<=[=:,\s]))" + re.escape(mount.rstrip("/")) + r"(?=/|$|[\s,:])")
            if pat.search(s):
                local.mkdir(parents=True, exist_ok=True)
                s = pat.sub(str(local), s)
        return s

    def pod_spec(self, rank: int, attempt: int) -> Pod:
        """The process one pod of the ``node`` Job would be, with the env the kubelet would give it."""
        r = self.r
        hostname = f"{r.job_name}-node-0-{rank}"
        name = f"{hostname}-a{attempt}"
        pod_dir = self.workdir / "pods" / name
        (pod_dir / "home").mkdir(parents=True, exist_ok=True)
        field_values = {
            COMPLETION_INDEX_FIELD: str(rank),
            "metadata.name": name,
            "metadata.namespace": "default",
            "spec.nodeName": f"emulated-node-{rank}",
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "metadata.labels['jobset.sigs.k8s.io/restart-attempt']": str(attempt),
        }
        env: dict[str, str] = {}
        for e in r.env:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                path = (vf.get("fieldRef") or {}).get("fieldPath")
                if path in field_values:
                    env[e["name"]] = field_values[path]
                elif "resourceFieldRef" in vf:
                    env[e["name"]] = "1"
                elif any(k in vf for k in ("secretKeyRef", "configMapKeyRef")) and \
                        (vf.get("secretKeyRef") or vf.get("configMapKeyRef") or {}).get("optional"):
                    continue
                else:
                    raise ContractError(f"env {e['name']}: valueFrom {vf} is not emulated")
            else:
                env[e["name"]] = _expand(e.get("value", ""), env)
        # The deliberate, reported differences: loopback rendezvous, a port that can't collide here.
        env["PET_MASTER_ADDR"] = "127.0.0.1"
        env["PET_MASTER_PORT"] = str(self.master_port)
        env = {k: self._map_path(v, pod_dir) for k, v in env.items()}
        argv = [self._map_path(_expand(a, env), pod_dir) for a in r.command]
        base = {"PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(pod_dir / "home"),
                "HOSTNAME": hostname, "LANG": "C.UTF-8"}
        cwd = self._map_path(r.working_dir, pod_dir) if r.working_dir else str(self.project_root)
        if not os.path.isdir(cwd):
            raise ContractError(f"workingDir {r.working_dir!r} does not exist in the emulation")
        return Pod(name=name, rank=rank, attempt=attempt, argv=argv, env={**base, **env}, cwd=cwd,
                   log_path=str(self.workdir / f"{name}.log"))

    # --------------------------------------------------------------------------------------------- run
    def _event(self, what: str, detail: str = "") -> None:
        self.events.append(Event(time.time(), what, detail))
        self.echo(f"[emulator] {what}" + (f": {detail}" if detail else ""))

    def run(self, *, faults: list[Fault] = (), progress: Callable[[], int] | None = None,
            timeout_s: float = 900.0) -> str:
        """Run to a terminal state ("Complete" or "Failed"); faults fire when ``progress()`` reaches their step."""
        r = self.r
        pending = sorted(faults, key=lambda f: f.at_step)
        deadline = time.time() + timeout_s
        attempt = 0
        self._event("TrainJob created", f"{r.num_nodes} node(s) x {r.nproc_per_node} proc, backoffLimit "
                    f"{r.backoff_limit}, maxRestarts {r.max_restarts}, master 127.0.0.1:{self.master_port}")
        while True:
            pods = self._start_pods(attempt)
            failed = [0]  # Job failure count towards backoffLimit
            try:
                outcome = self._watch(pods, attempt, pending, progress, deadline, failed)
            except BaseException:  # Ctrl-C, a test timeout: leave no training processes behind
                for p in pods:
                    p.kill_all()
                raise
            if outcome[0] == "Complete":
                self.state = "Complete"
                self._event("TrainJob Complete", f"JobSet restarts {self.restarts}")
                return self.state
            if outcome[0] == "Timeout":
                self._teardown(pods, grace_s=0)
                self.state, self.message = "Failed", f"emulation timed out after {timeout_s:.0f} s"
                self._event("TrainJob Failed", self.message)
                return self.state
            reason, message = outcome[1], outcome[2]
            self._event("Job failed", f"{reason}: {message}")
            self._teardown(pods, grace_s=r.grace_s)
            if r.max_restarts is None:
                action, rule = "FailJobSet", "(no failurePolicy)"
            else:
                action, rule = jobset_failure_action(r.failure_rules, reason, message)
            if action == "RestartJobSet" and self.restarts_towards_max >= r.max_restarts:
                self.state, self.message = "Failed", f"JobSet reached maxRestarts={r.max_restarts} ({message})"
                self._event("TrainJob Failed", self.message)
                return self.state
            if action in ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
                          "RestartJobAndIgnoreMaxRestarts"):
                self.restarts += 1
                if "Ignore" not in action:
                    self.restarts_towards_max += 1
                attempt += 1
                self._event("JobSet restart", f"rule {rule} -> {action}; restarts {self.restarts}"
                            f"/{r.max_restarts}, recreating all {r.num_nodes} pod(s)")
                continue
            self.state, self.message = "Failed", f"JobSet failurePolicy rule {rule} -> {action} ({message})"
            self._event("TrainJob Failed", self.message)
            return self.state

    def _start_pods(self, attempt: int) -> list[Pod]:
        pods = []
        for rank in range(self.r.num_nodes):
            p = self.pod_spec(rank, attempt)
            p.start()
            pods.append(p)
        self._event("pods started", ", ".join(f"{p.name} (pid {p.proc.pid})" for p in pods))
        return pods

    def _teardown(self, pods: list[Pod], grace_s: float) -> None:
        live = [p for p in pods if p.poll() is None]
        threads = [threading.Thread(target=p.terminate, args=(grace_s,)) for p in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if live:
            self._event("pods terminated", ", ".join(f"{p.name} exit {p.exit_code}" for p in live))

    def _watch(self, pods: list[Pod], attempt: int, pending: list[Fault], progress, deadline: float,
               failed: list[int]) -> tuple[str, str, str]:
        r = self.r
        succeeded: set[int] = set()
        while True:
            if time.time() > deadline:
                return ("Timeout", "", "")
            table = _proc_table()
            for p in pods:
                p.track(table)
            step = progress() if (progress and pending) else 0
            while pending and step >= pending[0].at_step:
                self._inject(pending.pop(0), pods, step)
            for i, p in enumerate(pods):
                # a fault's terminate thread may have reaped the pod already: 'handled' is ours alone
                if p.handled or p.poll() is None:
                    continue
                p.handled = True
                if p.exit_code == 0:
                    succeeded.add(p.rank)
                    self._event("pod succeeded", p.name)
                    continue
                self.pod_failures += 1
                action, why = pod_failure_action(r.pod_failure_rules, p.exit_code, p.conditions, f"default/{p.name}")
                self._event("pod failed", f"{p.name} exit {p.exit_code}, conditions {sorted(p.conditions) or '-'}"
                            f" -> podFailurePolicy {action}")
                if action == "FailJob":
                    return ("Failed", "PodFailurePolicy", why)
                if action == "Ignore" or (action == "Count" and failed[0] < r.backoff_limit):
                    if action == "Count":
                        failed[0] += 1
                    # the Job controller replaces just this pod: the gang is NOT restarted
                    repl = self.pod_spec(p.rank, attempt)
                    repl.name = f"{repl.name}-r{self.pod_failures}"
                    repl.log_path = str(self.workdir / f"{repl.name}.log")
                    repl.start()
                    pods[i] = repl
                    self._event("pod replaced by the Job controller", f"{repl.name} ({action})")
                    continue
                if action == "FailIndex":
                    return ("Failed", "FailedIndexes", "Job has failed indexes")
                return ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            if len(succeeded) == r.num_nodes:
                return ("Complete", "", "")
            time.sleep(0.2)

    def _inject(self, f: Fault, pods: list[Pod], step: int) -> None:
        target = next((p for p in pods if p.rank == f.rank and p.exit_code is None), None)
        if target is None:
            self._event("fault skipped", f"no running pod for node {f.rank}")
            return
        self._event(f"fault {f.kind}", f"node {f.rank} pod {target.name} at step {step}")
        self.fault_log.append({"label": f"{f.kind} node-{f.rank} pod", "time": self.events[-1].time,
                               "step": step, "pod": target.name, "kind": f.kind, "rank": f.rank})
        if f.kind == "kill":
            target.kill_all(signal.SIGKILL)
        else:
            if f.kind == "evict":
                target.conditions.add("DisruptionTarget")
            threading.Thread(target=target.terminate, args=(self.r.grace_s,), daemon=True).start()

    # ----------------------------------------------------------------------------------------- helpers
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
        return [f"PET_MASTER_ADDR {self.r.job_name}-node-0-0.{self.r.job_name} -> 127.0.0.1 (shared host network)",
                f"PET_MASTER_PORT {TRAINER_PORT} -> {self.master_port}" if self.master_port != TRAINER_PORT else
                f"PET_MASTER_PORT {TRAINER_PORT}",
                *(f"volume {m} ({kind}) -> {self.fsx_dir if kind == 'pvc' else 'per-pod temp dir'}"
                  for m, kind in self.r.mounts.items()),
                "image -> this checkout + venv; no scheduling, GPUs, EFA or resource limits"]


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
    p = argparse.ArgumentParser(prog="python -m testbed.k8s_emulator",
                                description=__doc__.split("\n\n")[0],
                                epilog="See docs/kubernetes.md (the contract emulator).")
    p.add_argument("--runtime", required=True, help="YAML with the rendered ClusterTrainingRuntime")
    p.add_argument("--trainjob", required=True, help="YAML with the rendered TrainJob")
    p.add_argument("--fsx-dir", required=True, help="local directory standing in for the FSx volume")
    p.add_argument("--workdir", help="pod logs and scratch (default: a temp dir)")
    p.add_argument("--fault", action="append", type=Fault.parse, default=[],
                   help="KIND:RANK@STEP, e.g. kill:1@4 (repeatable; KIND kill|delete|evict)")
    p.add_argument("--master-port", type=int, default=TRAINER_PORT,
                   help=f"PET_MASTER_PORT (Trainer injects {TRAINER_PORT}; 0 = pick a free port)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--report", help="write the report JSON here")
    p.add_argument("--reference", type=Path,
                   help="final checkpoint of an uninterrupted run of the same job: the verdict compares weights")
    a = p.parse_args(argv)
    try:
        emu = Emulator(load_manifest(a.runtime, "ClusterTrainingRuntime"), load_manifest(a.trainjob, "TrainJob"),
                       fsx_dir=a.fsx_dir, workdir=a.workdir, master_port=a.master_port)
    except (ContractError, schema.SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mpath = emu.metrics_path()
    t0 = time.time()
    state = emu.run(faults=a.fault, progress=lambda: last_step(mpath), timeout_s=a.timeout)
    rep = verdicts.emulator_result(emu, mpath, t0, a.reference, judged=bool(a.fault))
    print(verdicts.format_report(rep))
    if a.report:
        Path(a.report).write_text(json.dumps(rep, indent=2, default=str))
    return 0 if state == "Complete" and (rep["passed"] or not a.fault) else 1


if __name__ == "__main__":
    sys.exit(main())

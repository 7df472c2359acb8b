"""Talk to the cluster: kubeconfig, pre-flight checks, TrainJob create/watch, pods, logs, files on FSx.

Uses the pinned ``kubernetes`` Python client with the current kubeconfig (``$KUBECONFIG`` or
``~/.kube/config``; for EKS, ``aws eks update-kubeconfig`` writes it). Every failure a user can fix is a
:class:`ClusterError` whose message says what is wrong and what to run.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator

from cluster_assets.k8s import schema

TRAINER_GROUP, TRAINER_VERSION = schema.API_GROUP, "v1alpha1"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
REQUIRED_CRDS = (
    f"trainjobs.{TRAINER_GROUP}",
    f"clustertrainingruntimes.{TRAINER_GROUP}",
    f"jobsets.{JOBSET_GROUP}",
)
# Labels JobSet and the Job controller put on every pod of a TrainJob.
L_JOBSET = "jobset.sigs.k8s.io/jobset-name"
L_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
L_RESTART = "jobset.sigs.k8s.io/restart-attempt"
L_INDEX = "batch.kubernetes.io/job-completion-index"
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
#: Container waiting reasons the kubelet does not get past by itself: a Secret/ConfigMap/env the container names is
#: missing, or the runtime cannot create the container from this spec.
CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError")
FIX_KUBECONFIG = (
    "run `aws eks update-kubeconfig --name <cluster> --region <region>` (the EKS stack's "
    "KubeconfigCommand output prints it), or set KUBECONFIG"
)
FIX_TRAINER = (
    "deploy the EKS stack (`cdk deploy` with platform=eks), which installs Kubeflow Trainer v2.3 and "
    "JobSet from their pinned Helm charts"
)


class ClusterError(RuntimeError):
    """Something about the cluster prevents the job; the message names it and the fix."""


def _client():
    try:
        import kubernetes  # noqa: F401  (pinned in requirements.txt)
    except ImportError:  # pragma: no cover - the venv always has it
        raise ClusterError("the kubernetes Python client is missing: run scripts/venv.sh") from None
    from kubernetes import client, config

    return client, config


def _api_error(e: Exception, what: str) -> ClusterError:
    """Turn an API or connection exception into a ClusterError that says what was attempted."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        reason = e.reason
        try:
            import json

            reason = json.loads(e.body).get("message", reason)
        except Exception:  # noqa: BLE001 - body is not JSON
            pass
        if e.status in (401, 403):
            return ClusterError(
                f"{what}: the cluster refused your credentials ({e.status}: {reason}); check the "
                f"AWS identity in use has an EKS access entry, or {FIX_KUBECONFIG}"
            )
        return ClusterError(f"{what}: {e.status} {reason}")
    return ClusterError(f"{what}: {type(e).__name__}: {e}")


@dataclass
class Cluster:
    """A connected cluster (kubeconfig loaded and the API server answered)."""

    api: Any
    host: str
    context: str

    # ----------------------------------------------------------------------------------------- clients
    @property
    def core(self):
        return _client()[0].CoreV1Api(self.api)

    @property
    def custom(self):
        return _client()[0].CustomObjectsApi(self.api)

    def _call(self, what: str, fn, *args, not_found: str | None = None, **kwargs):
        """Call the API; 404 -> None when ``not_found`` is None, else ClusterError(not_found)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=30, **kwargs)
        except ApiException as e:
            if e.status == 404:
                if not_found is None:
                    return None
                raise ClusterError(not_found) from None
            raise _api_error(e, what) from None
        except Exception as e:  # noqa: BLE001 - urllib3 connection errors and the like
            raise _api_error(e, what) from None

    # -------------------------------------------------------------------------------------- pre-flight
    def check_trainer(self) -> None:
        """Kubeflow Trainer (v1alpha1 API) and JobSet CRDs are installed."""
        ext = _client()[0].ApiextensionsV1Api(self.api)
        for crd in REQUIRED_CRDS:
            obj = self._call(
                f"reading CRD {crd}",
                ext.read_custom_resource_definition,
                crd,
                not_found=f"Kubeflow Trainer is not installed on {self.host}: CRD {crd} is missing; {FIX_TRAINER}",
            )
            served = [v.name for v in obj.spec.versions if v.served]
            want = TRAINER_VERSION if crd.endswith(TRAINER_GROUP) else JOBSET_VERSION
            if want not in served:
                raise ClusterError(
                    f"CRD {crd} serves {served}, not {want}: the installed Trainer/JobSet line does "
                    f"not match the pinned API ({schema.TRAINER_API_PIN}); {FIX_TRAINER}"
                )

    def get_runtime(self, name: str) -> dict[str, Any]:
        """Our ClusterTrainingRuntime as the cluster has it."""
        return self._call(
            f"reading ClusterTrainingRuntime {name}",
            self.custom.get_cluster_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            "clustertrainingruntimes",
            name,
            not_found=(
                f"ClusterTrainingRuntime {name!r} is missing on {self.host}: deploy the EKS stack (it "
                f"installs it), or apply it with `python -m tools.k8s.submit --print-runtime | "
                f"kubectl apply -f -`"
            ),
        )

    def check_namespace(self, namespace: str) -> None:
        self._call(
            f"reading namespace {namespace}",
            self.core.read_namespace,
            namespace,
            not_found=f"namespace {namespace!r} does not exist: pass --namespace (the EKS stack creates "
            f"the training namespace with the FSx PVC)",
        )

    def check_pvc(self, namespace: str, claim: str) -> None:
        pvc = self._call(
            f"reading PVC {namespace}/{claim}",
            self.core.read_namespaced_persistent_volume_claim,
            claim,
            namespace,
            not_found=f"PersistentVolumeClaim {claim!r} (the FSx volume the runtime mounts) is missing "
            f"in namespace {namespace!r}: use the namespace the EKS stack created it in "
            f"(--namespace)",
        )
        if pvc.status and pvc.status.phase not in ("Bound", None):
            raise ClusterError(
                f"PVC {namespace}/{claim} is {pvc.status.phase}, not Bound: check the FSx CSI driver "
                f"add-on and the static PV (kubectl describe pvc -n {namespace} {claim})"
            )

    def secret_exists(self, namespace: str, name: str) -> bool:
        return (
            self._call(f"reading Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace)
            is not None
        )

    # ------------------------------------------------------------------------------------------ batch Jobs
    @property
    def batch(self):
        return _client()[0].BatchV1Api(self.api)

    def create_job(self, manifest: dict[str, Any]) -> None:
        ns = manifest["metadata"]["namespace"]
        self._call(f"creating Job {ns}/{manifest['metadata']['name']}", self.batch.create_namespaced_job, ns, manifest)

    def cronjob_image(self, namespace: str, name: str) -> str | None:
        """The first container image of CronJob ``name``, None if it is missing."""
        cron = self._call(f"reading CronJob {namespace}/{name}", self.batch.read_namespaced_cron_job, name, namespace)
        if cron is None:
            return None
        return cron.spec.job_template.spec.template.spec.containers[0].image

    def job_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job's status as a dict (``succeeded``, ``failed``, ``active``, ``conditions``), None if missing."""
        job = self._call(f"reading Job {namespace}/{name}", self.batch.read_namespaced_job, name, namespace)
        return None if job is None else self.api.sanitize_for_serialization(job.status) or {}

    def delete_job(self, namespace: str, name: str) -> None:
        body = _client()[0].V1DeleteOptions(propagation_policy="Background")
        self._call(f"deleting Job {namespace}/{name}", self.batch.delete_namespaced_job, name, namespace, body=body)

    def job_log_tail(self, namespace: str, job: str, lines: int = 5) -> str:
        """The last lines of the newest pod of Job ``job`` ("" when it has none)."""
        res = self._call(
            f"listing pods of Job {namespace}/{job}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"job-name={job}",
        )
        pods = sorted(res.items if res else [], key=lambda p: p.metadata.creation_timestamp or 0)
        if not pods:
            return ""
        return (
            self._call(
                f"reading the log of {pods[-1].metadata.name}",
                self.core.read_namespaced_pod_log,
                pods[-1].metadata.name,
                namespace,
                tail_lines=lines,
            )
            or ""
        )

    def train_job_exists(self, namespace: str, name: str) -> bool:
        return self.get_train_job(namespace, name) is not None

    # ------------------------------------------------------------------------------------------ objects
    def create_train_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            return self.custom.create_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", manifest, _request_timeout=30
            )
        except ApiException as e:
            if e.status == 409:
                raise ClusterError(
                    f"TrainJob {ns}/{name} already exists: pick another --name, or delete it first "
                    f"(`kubectl delete trainjob -n {ns} {name}`; its checkpoints on FSx stay, and "
                    f"re-submitting the same name resumes from them)"
                ) from None
            if e.status in (400, 422):
                raise _api_error(e, f"the cluster rejected TrainJob {ns}/{name} (Trainer webhook/schema)") from None
            raise _api_error(e, f"creating TrainJob {ns}/{name}") from None
        except Exception as e:  # noqa: BLE001
            raise _api_error(e, f"creating TrainJob {ns}/{name}") from None

    def get_train_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"reading TrainJob {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            "trainjobs",
            name,
        )

    def delete_train_job(self, namespace: str, name: str) -> None:
        self._call(
            f"deleting TrainJob {namespace}/{name}",
            self.custom.delete_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            "trainjobs",
            name,
        )

    def get_jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"reading JobSet {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            namespace,
            "jobsets",
            name,
        )

    def pods(self, namespace: str, name: str, replicated_job: str | None = "node") -> list[Any]:
        """Pods of the TrainJob's ``node`` (or another) replicated job, newest restart attempt first; ``None``:
        every pod of the TrainJob (the store's too)."""
        selector = f"{L_JOBSET}={name}" + (f",{L_RJOB}={replicated_job}" if replicated_job else "")
        res = self._call(
            f"listing pods of {namespace}/{name}", self.core.list_namespaced_pod, namespace, label_selector=selector
        )
        items = list(res.items) if res else []
        return sorted(items, key=lambda p: (-pod_attempt(p), pod_rank(p)))

    def node_pod(self, namespace: str, name: str, rank: int) -> Any | None:
        """The pod of node ``rank`` in the newest restart attempt (not one being deleted)."""
        for p in self.pods(namespace, name):
            if pod_rank(p) == rank and not p.metadata.deletion_timestamp:
                return p
        return None

    def delete_pod(self, namespace: str, pod: str, grace_s: int | None = None) -> None:
        body = _client()[0].V1DeleteOptions(grace_period_seconds=grace_s) if grace_s is not None else None
        self._call(f"deleting pod {namespace}/{pod}", self.core.delete_namespaced_pod, pod, namespace, body=body)

    def follow_logs(self, namespace: str, pod: str, container: str = "node") -> Iterator[str]:
        """Lines of a pod's log until the container ends (empty if it never started)."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.core.read_namespaced_pod_log(
                pod, namespace, container=container, follow=True, _preload_content=False
            )
        except ApiException:
            return
        buf = b""
        try:
            for chunk in resp.stream(4096):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
        except Exception:  # noqa: BLE001 - connection dropped when the pod went away
            pass
        if buf:
            yield buf.decode(errors="replace")

    # ------------------------------------------------------------------------------------------- nodes
    def cordon(self, node: str, unschedulable: bool = True) -> None:
        self._call(f"cordoning node {node}", self.core.patch_node, node, {"spec": {"unschedulable": unschedulable}})

    def drain(self, node: str, grace_s: int = 60) -> list[str]:
        """Cordon ``node`` and evict its pods (DaemonSet pods stay), like ``kubectl drain``; returns evicted."""
        c = _client()[0]
        self.cordon(node)
        res = self._call(
            f"listing pods on {node}", self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        evicted = []
        for p in res.items if res else []:
            owners = p.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners) or p.status.phase in ("Succeeded", "Failed"):
                continue
            body = c.V1Eviction(
                metadata=c.V1ObjectMeta(name=p.metadata.name, namespace=p.metadata.namespace),
                delete_options=c.V1DeleteOptions(grace_period_seconds=grace_s),
            )
            self._call(
                f"evicting {p.metadata.namespace}/{p.metadata.name}",
                self.core.create_namespaced_pod_eviction,
                p.metadata.name,
                p.metadata.namespace,
                body,
            )
            evicted.append(f"{p.metadata.namespace}/{p.metadata.name}")
        return evicted

    # ---------------------------------------------------------------------------------- files on FSx
    def start_reader(
        self,
        namespace: str,
        name: str,
        image: str,
        claim: str,
        mount_path: str,
        near_jobset: str | None = None,
        timeout_s: float = 900,
    ) -> str:
        """A small long-lived pod that mounts the FSx PVC read-only, to read job files with ``exec``.

        It tolerates the GPU taint and prefers a node running ``near_jobset``'s pods: there the (large)
        training image is already pulled, so it starts in seconds instead of a multi-GB pull."""
        c = _client()[0]
        affinity = None
        if near_jobset:
            affinity = c.V1Affinity(
                pod_affinity=c.V1PodAffinity(
                    preferred_during_scheduling_ignored_during_execution=[
                        c.V1WeightedPodAffinityTerm(
                            weight=100,
                            pod_affinity_term=c.V1PodAffinityTerm(
                                topology_key="kubernetes.io/hostname",
                                label_selector=c.V1LabelSelector(match_labels={L_JOBSET: near_jobset}),
                            ),
                        )
                    ]
                )
            )
        pod = c.V1Pod(
            metadata=c.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={"app.kubernetes.io/part-of": "t5-failover", "t5-failover/role": "fsx-reader"},
            ),
            spec=c.V1PodSpec(
                restart_policy="Never",
                termination_grace_period_seconds=1,
                affinity=affinity,
                tolerations=[c.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
                containers=[
                    c.V1Container(
                        name="reader",
                        image=image,
                        command=["sleep", "86400"],
                        resources=c.V1ResourceRequirements(requests={"cpu": "50m", "memory": "64Mi"}),
                        volume_mounts=[c.V1VolumeMount(name="fsx", mount_path=mount_path, read_only=True)],
                    )
                ],
                volumes=[
                    c.V1Volume(
                        name="fsx",
                        persistent_volume_claim=c.V1PersistentVolumeClaimVolumeSource(claim_name=claim, read_only=True),
                    )
                ],
            ),
        )
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespaced_pod(namespace, pod, _request_timeout=30)
        except ApiException as e:
            if e.status != 409:
                raise _api_error(e, f"creating reader pod {namespace}/{name}") from None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            p = self._call("reading reader pod", self.core.read_namespaced_pod, name, namespace)
            if p and p.status.phase == "Running":
                return name
            for cs in (p.status.container_statuses or []) if p else []:
                if cs.state.waiting and cs.state.waiting.reason in IMAGE_ERRORS:
                    raise ClusterError(f"reader pod cannot pull {image}: {cs.state.waiting.message}")
            time.sleep(3)
        raise ClusterError(
            f"reader pod {namespace}/{name} did not start in {timeout_s:.0f} s (kubectl describe pod -n "
            f"{namespace} {name})"
        )

    def exec_read(self, namespace: str, pod: str, path: str, container: str | None = None) -> str:
        """Contents of ``path`` inside a running pod ("" when the file does not exist yet)."""
        from kubernetes.stream import stream

        cmd = ["sh", "-c", f"cat {shlex_quote(path)} 2>/dev/null || true"]
        try:
            return stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=cmd,
                container=container,
                stderr=False,
                stdin=False,
                stdout=True,
                tty=False,
                _preload_content=True,
            )
        except Exception as e:  # noqa: BLE001
            raise _api_error(e, f"reading {path} in pod {namespace}/{pod}") from None

    def exec_run(self, namespace: str, pod: str, argv: list[str], container: str | None = None) -> tuple[int, str]:
        """Run ``argv`` inside a running pod; returns (exit code, stdout + stderr)."""
        from kubernetes.stream import stream
        import shlex

        cmd = ["sh", "-c", f"{shlex.join(argv)} 2>&1; echo __exit=$?"]
        try:
            out = stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=cmd,
                container=container,
                stderr=False,
                stdin=False,
                stdout=True,
                tty=False,
                _preload_content=True,
            )
        except Exception as e:  # noqa: BLE001
            raise _api_error(e, f"running {argv[:3]} in pod {namespace}/{pod}") from None
        body, _, code = out.rpartition("__exit=")
        return (int(code.strip()) if code.strip().isdigit() else 255), body


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def pod_rank(pod: Any) -> int:
    labels = pod.metadata.labels or {}
    ann = pod.metadata.annotations or {}
    raw = labels.get(L_INDEX) or ann.get(L_INDEX) or "-1"
    return int(raw) if raw.lstrip("-").isdigit() else -1


def pod_attempt(pod: Any) -> int:
    raw = (pod.metadata.labels or {}).get(L_RESTART, "0")
    return int(raw) if raw.isdigit() else 0


def pod_problem(pod: Any) -> str | None:
    """A reason this pod will never run by itself (image missing, container config broken), or None."""
    for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []) if pod.status else []:
        w = cs.state.waiting if cs.state else None
        if w and w.reason in IMAGE_ERRORS + CONFIG_ERRORS:
            return f"{w.reason}: {w.message or ''}".strip().rstrip(":")
    return None


def pod_pending_reason(pod: Any) -> str | None:
    """The scheduler's message for an unschedulable pod (e.g. Insufficient nvidia.com/gpu), or None."""
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.message or cond.reason
    return None


@dataclass(frozen=True)
class StartProblem:
    """Why a pod of a TrainJob cannot start. ``fatal``: it never will by itself (the watch stops with ``line``);
    otherwise it may still (an unschedulable pod waits for a node) and ``line`` is printed while it waits."""

    pod: str
    reason: str
    fatal: bool
    line: str


def pod_start_problem(pod: Any, namespace: str, trainjob: str) -> StartProblem | None:
    """The one line for a pod of TrainJob ``namespace/trainjob`` that cannot start: its name, the reason and the fix
    (a TrainJob's pods are its nodes, which run the TrainJob's image); or None."""
    name = pod.metadata.name
    describe = f"`kubectl describe pod -n {namespace} {name}`"
    resubmit = f"then delete the TrainJob (`kubectl delete trainjob -n {namespace} {trainjob}`) and submit again"
    problem = pod_problem(pod)
    if problem:
        reason = problem.split(":", 1)[0]
        image = _waiting_image(pod) or "its image"
        if reason in CONFIG_ERRORS:
            fix = (
                f"a Secret, ConfigMap or volume the pod names is missing or invalid ({describe} says which); "
                f"fix it, {resubmit}"
            )
        else:
            fix = (
                f"the image {image} is missing or not pullable: push it with `make image` (or submit a tag that "
                f"exists with IMAGE_TAG=...), {resubmit}"
            )
        return StartProblem(name, reason, True, f"pod {name} cannot start: {problem}; {fix}")
    pending = pod_pending_reason(pod)
    if pending:
        fix = (
            f"it starts once GPU nodes with room for it exist: the GPU node group scales up to context gpuNodes "
            f"(check its size and your EC2 quota for the instance type); {describe}"
        )
        return StartProblem(name, "Unschedulable", False, f"pod {name} is not scheduled yet: {pending}; {fix}")
    return None


def _waiting_image(pod: Any) -> str | None:
    """The image of the first container of ``pod`` that waits for its image (from the spec, by container name)."""
    waiting = [
        cs.name
        for cs in ((pod.status.container_statuses or []) + (pod.status.init_container_statuses or []))
        if cs.state and cs.state.waiting and cs.state.waiting.reason in IMAGE_ERRORS
    ]
    for c in ((pod.spec.containers or []) + (pod.spec.init_containers or [])) if pod.spec else []:
        if c.name in waiting:
            return c.image
    return None


def connect(context: str | None = None, timeout_s: float = 15.0) -> Cluster:
    """Load the kubeconfig and make sure the API server answers; ClusterError with the fix otherwise."""
    client, config = _client()
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
        config.KUBE_CONFIG_DEFAULT_LOCATION
    )
    if not os.path.exists(path):
        raise ClusterError(f"no kubeconfig at {path}: {FIX_KUBECONFIG}")
    conf = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=conf)
    except Exception as e:  # noqa: BLE001 - ConfigException, YAML errors, exec plugin failures
        raise ClusterError(
            f"cannot use kubeconfig {path}" + (f" (context {context})" if context else "") + f": {e}; {FIX_KUBECONFIG}"
        ) from None
    conf.retries = 1
    api = client.ApiClient(conf)
    _, active = config.list_kube_config_contexts(config_file=path)
    ctx = context or (active or {}).get("name", "?")
    try:
        client.VersionApi(api).get_code(_request_timeout=timeout_s)
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        m = re.search(r"(Connection refused|Name or service not known|timed out|Max retries exceeded)", msg)
        raise ClusterError(
            f"cannot reach the Kubernetes API at {conf.host} (context {ctx}): "
            f"{m.group(1) if m else msg.splitlines()[0][:300]}; is the cluster up and the "
            f"kubeconfig current? {FIX_KUBECONFIG}"
        ) from None
    return Cluster(api=api, host=conf.host, context=ctx)

"""A minimal stand-in for the Kubernetes API server's REST responses, on loopback over plain HTTP.

No real API server can run on this machine (no kind/k3s/envtest binaries reach it), so the submit CLI's
cluster paths are exercised against recorded-shape responses: /version, CRDs, the ClusterTrainingRuntime,
namespace, PVC, TrainJob create/get, JobSet get, pod list. State is a dict the test sets up; the CLI talks
to it through a real kubeconfig with the real ``kubernetes`` client. It also answers ECR's DescribeImages (JSON 1.1,
``POST /``) for a real ``boto3`` client pointed at it (:meth:`Stub.ecr_env`).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

CRDS = ("trainjobs.trainer.kubeflow.org", "clustertrainingruntimes.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io")


def crd(name: str) -> dict[str, Any]:
    plural, group = name.split(".", 1)
    version = "v1alpha2" if group.startswith("jobset") else "v1alpha1"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": plural.title()},
            "versions": [{"name": version, "served": True, "storage": True}],
        },
    }


def matches(pod: dict[str, Any], query: str) -> bool:
    """Whether ``pod`` matches the equality-based ``labelSelector`` of a list query (``a=b,c=d``), as the API
    server filters; a pod without labels matches only an empty selector."""
    selector = parse_qs(query).get("labelSelector", [""])[0]
    labels = pod.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",") if term))


class Stub:
    """Cluster state + a server answering the calls the submit CLI makes."""

    def __init__(self) -> None:
        self.crds = set(CRDS)
        self.runtimes: dict[str, dict] = {}
        self.namespaces = {"training"}
        self.pvcs = {("training", "fsx-claim"): "Bound"}
        self.trainjobs: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []  # pod JSON returned for every TrainJob
        self.finish_as = "Complete"  # condition a created TrainJob reports on its second read
        self.reads: dict[tuple[str, str], int] = {}
        self.ecr_images: set[tuple[str, str]] = set()  # (repository, tag) pairs ECR has
        self.secrets: set[tuple[str, str]] = {("training", "etcd-client")}  # (namespace, name) that exist
        self.jobs: dict[tuple[str, str], dict] = {}  # batch/v1 Jobs created (the etcd add-job Job)
        #: CronJobs that exist -> their image (the stack's etcd-cert-renewal, with the administration image)
        self.cronjobs: dict[tuple[str, str], str] = {("t5-etcd", "etcd-cert-renewal"): "t5-etcd-admin:asset"}
        self.job_outcome = "succeeded"  # what a created Job reports: succeeded / failed
        self.job_log = "[etcd-admin] etcd user job-x: read/write /t5-failover/jobs/x/\n"
        self.order: list[str] = []  # kinds created, in order
        self.secret_data: dict[tuple[str, str], dict] = {}  # Secrets written through the API (etcd admin script)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "stub",
                    "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
                    "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
                    "users": [{"name": "stub", "user": {"token": "t"}}],
                }
            )
        )
        return path

    def ecr_env(self) -> dict[str, str]:
        """Environment for a boto3 ECR client that asks this stub (dummy credentials: nothing leaves loopback)."""
        return {
            "AWS_ENDPOINT_URL_ECR": self.url,
            "AWS_ACCESS_KEY_ID": "stub",
            "AWS_SECRET_ACCESS_KEY": "stub",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def close(self) -> None:
        self.server.shutdown()

    # --------------------------------------------------------------------------------------------- routing
    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        path, _, query = path.partition("?")
        if method == "POST" and path == "/" and body and "repositoryName" in body:  # ECR DescribeImages
            tags = [i.get("imageTag") for i in body.get("imageIds", [])]
            found = [t for t in tags if (body["repositoryName"], t) in self.ecr_images]
            if len(found) < len(tags):
                return 400, {"__type": "ImageNotFoundException", "message": f"tag {tags} not in the stub"}
            return 200, {"imageDetails": [{"repositoryName": body["repositoryName"], "imageTags": found}]}
        if path.rstrip("/") == "/version":
            return 200, {
                "major": "1",
                "minor": "35",
                "gitVersion": "v1.35.0-stub",
                "gitCommit": "0",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if m := re.fullmatch(r"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/([^/]+)", path):
            return (200, crd(m[1])) if m[1] in self.crds else (404, None)
        if m := re.fullmatch(r"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/([^/]+)", path):
            return (200, self.runtimes[m[1]]) if m[1] in self.runtimes else (404, None)
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)", path):
            return (
                (200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": m[1]}})
                if m[1] in self.namespaces
                else (404, None)
            )
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/persistentvolumeclaims/([^/]+)", path):
            phase = self.pvcs.get((m[1], m[2]))
            return (
                (
                    200,
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": {"name": m[2]},
                        "spec": {},
                        "status": {"phase": phase},
                    },
                )
                if phase
                else (404, None)
            )
        if m := re.fullmatch(r"/apis/trainer.kubeflow.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?", path):
            ns, name = m[1], m[2]
            if method == "POST":
                key = (ns, body["metadata"]["name"])
                if key in self.trainjobs:
                    return 409, None
                self.trainjobs[key] = body
                self.order.append(f"TrainJob {key[1]}")
                return 201, body
            if (ns, name) not in self.trainjobs:
                return 404, None
            self.reads[(ns, name)] = self.reads.get((ns, name), 0) + 1
            tj = dict(self.trainjobs[(ns, name)])
            if self.reads[(ns, name)] >= 2 and self.finish_as:
                tj["status"] = {
                    "conditions": [
                        {"type": self.finish_as, "status": "True", "reason": "Stub", "message": "stub says so"}
                    ]
                }
            return 200, tj
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?", path):
            if method in ("POST", "PUT") or (m[1], m[2]) in self.secret_data:
                return self._secret(method, m[1], m[2], body)
            return (
                (200, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": m[2], "namespace": m[1]}})
                if (m[1], m[2]) in self.secrets
                else (404, None)
            )
        if (m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/cronjobs/([^/]+)", path)) and method == "GET":
            if (m[1], m[2]) not in self.cronjobs:
                return 404, None
            pod = {"containers": [{"name": "admin", "image": self.cronjobs[(m[1], m[2])]}]}
            return 200, {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": m[2], "namespace": m[1]},
                "spec": {"schedule": "17 3 1 * *", "jobTemplate": {"spec": {"template": {"spec": pod}}}},
            }
        if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?", path):
            return self._job(method, m[1], m[2], body)
        if re.fullmatch(r"/apis/jobset.x-k8s.io/v1alpha2/namespaces/[^/]+/jobsets/[^/]+", path):
            return 200, {"status": {"restarts": 0}}
        if re.fullmatch(r"/api/v1/namespaces/[^/]+/pods", path) and parse_qs(query).get("labelSelector", [""])[
            0
        ].startswith("job-name="):
            job = parse_qs(query)["labelSelector"][0].split("=", 1)[1]
            return 200, {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {},
                "items": [
                    {"metadata": {"name": f"{job}-abcde", "labels": {"job-name": job}}, "spec": {"containers": []}}
                ],
            }
        if re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/etcd-add-[^/]+/log", path):
            return 200, self.job_log
        if re.fullmatch(r"/api/v1/namespaces/[^/]+/pods", path):
            return 200, {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {},
                "items": [p for p in self.pods if matches(p, query)],
            }
        if re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log", path):
            return 200, "step 1/1 | stub log line\n"
        return 404, None

    def _secret(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, Any]:
        """Secrets with data: created (409 if it exists), replaced, read back."""
        if method == "POST":
            key = (ns, body["metadata"]["name"])
            if key in self.secret_data or key in self.secrets:
                return 409, None
            self.secret_data[key] = body
            self.secrets.add(key)
            return 201, body
        if method == "PUT":
            self.secret_data[(ns, name)] = body
            return 200, body
        return 200, self.secret_data[(ns, name)]

    def _job(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, Any]:
        """batch/v1 Jobs: created as given; read back with the outcome the test chose (a succeeded add-job Job has
        made the TrainJob's Secret)."""
        if method == "POST":
            name = body["metadata"]["name"]
            if (ns, name) in self.jobs:
                return 409, None
            self.jobs[(ns, name)] = body
            self.order.append(f"Job {name}")
            return 201, body
        if (ns, name) not in self.jobs:
            return 404, None
        if method == "DELETE":
            del self.jobs[(ns, name)]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        job = dict(self.jobs[(ns, name)])
        if self.job_outcome == "succeeded":
            trainjob = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
            self.secrets.add(("training", f"{trainjob}-etcd"))
            job["status"] = {"succeeded": 1}
        else:
            job["status"] = {
                "failed": 3,
                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
            }
        return 200, job

    def _handler(self):
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _do(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                code, obj = stub.route(method, self.path, body)
                if obj is None:
                    obj = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": code,
                        "reason": "NotFound" if code == 404 else "AlreadyExists",
                        "message": f"stub {code}",
                    }
                data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(obj, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._do("GET")

            def do_POST(self):
                self._do("POST")

            def do_PUT(self):
                self._do("PUT")

            def do_DELETE(self):
                self._do("DELETE")

        return H

"""Submitting without a usable cluster fails with the reason and the fix (exit 2), never a traceback."""

from __future__ import annotations

import os
import socket

import pytest

from cluster_assets.k8s.runtime import build_cluster_training_runtime
from tests.support.apiserver_stub import Stub
from tests.support.k8s import submit_cli
from tools.image_tag import source_tag

ARGS = ("--image", "t5:1", "--skip-image-check", "--no-logs", "--nodes", "2", "--name", "t5-stub", "--poll", "0.2")


def env_with(kubeconfig) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DRY_RUN"}
    env["KUBECONFIG"] = str(kubeconfig)
    return env


def test_no_kubeconfig(tmp_path):
    r = submit_cli(*ARGS, env=env_with(tmp_path / "missing"))
    assert r.returncode == 2
    assert "no kubeconfig" in r.stderr and "aws eks update-kubeconfig" in r.stderr
    assert "Traceback" not in r.stderr


def test_unreachable_cluster(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(f"""apiVersion: v1
kind: Config
current-context: gone
clusters: [{{name: gone, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
contexts: [{{name: gone, context: {{cluster: gone, user: u}}}}]
users: [{{name: u, user: {{token: x}}}}]
""")
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2
    assert "cannot reach the Kubernetes API" in r.stderr and "Traceback" not in r.stderr


def test_broken_kubeconfig(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and "cannot use kubeconfig" in r.stderr


@pytest.fixture
def stub(tmp_path):
    s = Stub()
    s.runtimes["t5-fault-tolerant"] = build_cluster_training_runtime(
        name="t5-fault-tolerant",
        pvc_name="fsx-claim",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:0.1.0",
        max_restarts=10,
        gpus_per_node=8,
        efa_per_node=32,
    )
    yield s, s.kubeconfig(tmp_path / "kubeconfig")
    s.close()


def test_trainer_not_installed(stub):
    s, kc = stub
    s.crds.discard("trainjobs.trainer.kubeflow.org")
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2
    assert "Kubeflow Trainer is not installed" in r.stderr and "trainjobs.trainer.kubeflow.org" in r.stderr


def test_runtime_missing(stub):
    s, kc = stub
    s.runtimes.clear()
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and "ClusterTrainingRuntime 't5-fault-tolerant' is missing" in r.stderr


def test_pvc_missing(stub):
    s, kc = stub
    s.pvcs.clear()
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and "PersistentVolumeClaim 'fsx-claim'" in r.stderr


def test_submit_waits_for_completion_and_uses_this_checkouts_image_in_the_runtime_repository(stub):
    # The runtime names <stack's ECR repository>:<imageTag>; a submission without --image runs this checkout's
    # code: the same repository with the tag `make image` pushes for it (tools.image_tag).
    s, kc = stub
    r = submit_cli(*[a for a in ARGS if a not in ("--image", "t5:1")], env=env_with(kc))
    assert r.returncode == 0, r.stderr
    assert "completed" in r.stdout
    (tj,) = s.trainjobs.values()
    assert tj["spec"]["trainer"]["image"] == f"123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:{source_tag()}"


def test_image_tag_from_the_environment(stub):
    s, kc = stub
    r = submit_cli(*[a for a in ARGS if a not in ("--image", "t5:1")], env={**env_with(kc), "IMAGE_TAG": "mine-1"})
    assert r.returncode == 0, r.stderr
    (tj,) = s.trainjobs.values()
    assert tj["spec"]["trainer"]["image"] == "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:mine-1"


def test_failed_trainjob_exits_1(stub):
    s, kc = stub
    s.finish_as = "Failed"
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 1 and "FAILED" in r.stdout


def test_existing_name_is_refused(stub):
    s, kc = stub
    assert submit_cli(*ARGS, env=env_with(kc)).returncode == 0
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and "already exists" in r.stderr and "resumes" in r.stderr


def job_pod(
    replicated_job: str, waiting: dict | None = None, scheduled: dict | None = None, name: str = "t5-stub"
) -> dict:
    """A pod of TrainJob ``name`` as JobSet labels it, waiting with ``waiting`` or unscheduled per ``scheduled``."""
    status: dict = {"phase": "Pending"}
    if waiting:
        status["containerStatuses"] = [
            {
                "name": replicated_job,
                "image": "img",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": waiting},
            }
        ]
    if scheduled:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", **scheduled}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{replicated_job}-0-0-x",
            "uid": f"u-{replicated_job}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": {"containers": [{"name": replicated_job, "image": f"repo/t5:{replicated_job}-tag"}]},
        "status": status,
    }


def test_image_that_cannot_be_pulled(stub):
    s, kc = stub
    s.finish_as = None
    s.pods = [job_pod("node", {"reason": "ImagePullBackOff", "message": "manifest unknown"})]
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2
    assert "ImagePullBackOff" in r.stderr and "make image" in r.stderr


def test_a_pod_with_a_broken_container_config_is_reported(stub):
    s, kc = stub
    s.finish_as = None
    s.pods = [job_pod("node", {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'})]
    r = submit_cli(*ARGS, "--timeout", "5", env=env_with(kc))
    assert r.returncode == 2
    assert 'cannot start: CreateContainerConfigError: secret "x" not found; a Secret, ConfigMap' in r.stderr


def test_an_unschedulable_pod_is_named_while_the_job_waits(stub):
    s, kc = stub  # the stub's TrainJob completes on its second read: the first poll sees the pod pending
    s.pods = [
        job_pod(
            "node",
            scheduled={"reason": "Unschedulable", "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."},
        )
    ]
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 0, r.stderr
    assert (
        "[submit] pod t5-stub-node-0-0-x is not scheduled yet: 0/2 nodes are available: 2 Insufficient "
        "nvidia.com/gpu.; it starts once GPU nodes"
    ) in r.stdout and "gpuNodes" in r.stdout


def test_submit_makes_the_jobs_etcd_user_in_the_cluster_before_the_trainjob(stub):
    """Each TrainJob logs in to the cluster's etcd as its own user: the submit runs the add-job Job (the stack's
    administration image, read from its renewal CronJob; etcd namespace, system nodes, the etcd-add-job service
    account) and creates the TrainJob only once it succeeded."""
    s, kc = stub
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 0, r.stderr
    assert s.order == ["Job etcd-add-t5-stub", "TrainJob t5-stub"]
    job = s.jobs[("t5-etcd", "etcd-add-t5-stub")]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "t5-etcd-admin:asset" and c["command"][-3:] == ["add-job", "--job", "t5-stub"]
    assert pod["serviceAccountName"] == "etcd-add-job" and pod["nodeSelector"] == {"t5-failover/pool": "system"}
    assert job["metadata"]["labels"]["t5-failover/component"] == "etcd-admin"  # admitted by etcd's NetworkPolicy
    assert "etcd: creating user job-t5-stub" in r.stdout


def test_a_failed_etcd_user_job_stops_the_submit_with_its_reason(stub):
    s, kc = stub
    s.job_outcome = "failed"
    s.job_log = "[etcd-admin] waiting\nerror: add-job: StoreUnavailable: no etcd member answered\n"
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and not s.trainjobs
    (line,) = r.stderr.splitlines()
    assert line == (
        "error: etcd user for TrainJob t5-stub not created: Job t5-etcd/etcd-add-t5-stub failed (error: "
        "add-job: StoreUnavailable: no etcd member answered); see `kubectl -n t5-etcd logs "
        "job/etcd-add-t5-stub`"
    )


def test_an_etcd_that_was_never_bootstrapped_is_named_before_anything_is_created(stub):
    s, kc = stub
    s.secrets.clear()
    r = submit_cli(*ARGS, env=env_with(kc))
    assert r.returncode == 2 and not s.trainjobs and not s.jobs
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: Secret training/etcd-client is missing: the cluster's etcd is not bootstrapped yet")
    assert "etcd-bootstrap Job" in line


def test_chaos_without_cluster_fails_clearly(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    r = subprocess.run(
        [sys.executable, "-m", "chaos.eks", "--image", "t5:1"],
        cwd=ROOT,
        env=env_with(tmp_path / "missing"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no kubeconfig" in r.stderr


def test_node0_log_is_streamed(stub):
    s, kc = stub
    s.pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "t5-stub-node-0-0-abc",
                "uid": "u1",
                "labels": {
                    "batch.kubernetes.io/job-completion-index": "0",
                    "jobset.sigs.k8s.io/jobset-name": "t5-stub",
                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                    "jobset.sigs.k8s.io/restart-attempt": "0",
                },
            },
            "status": {"phase": "Running"},
        }
    ]
    r = submit_cli(*[a for a in ARGS if a != "--no-logs"], env=env_with(kc))
    assert r.returncode == 0, r.stderr
    assert "[node-0 attempt 0] step 1/1 | stub log line" in r.stdout

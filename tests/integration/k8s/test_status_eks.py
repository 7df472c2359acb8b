"""`make status PLATFORM=eks` (scripts/status.sh) against the API server stub with the real `kubernetes` client:
the TrainJob and its pods are read; with no pod running there is nothing to read the metrics through, which is
said in one line (exit 2), unless the TrainJob's own trainerStatus has the progress; a TrainJob that does not exist
is named. (Reading the metrics goes through a pod's exec, which the stub does not serve: that part runs on a
cluster.)"""

from __future__ import annotations

import os
import subprocess

from cluster_assets.k8s.schema import API_GROUP
from tests.support.apiserver_stub import Stub
from tests.conftest import ROOT
from tools.k8s.cluster import L_INDEX, L_JOBSET, L_RJOB


def make_status(kubeconfig, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "PLATFORM")}
    return subprocess.run(
        ["scripts/status.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "KUBECONFIG": str(kubeconfig), "PLATFORM": "eks", **env},
    )


def error(r: subprocess.CompletedProcess) -> str:
    """The one error line (the venv script may say it is installing first)."""
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    return line


def pod(job: str, rank: int, phase: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-node-0-{rank}-x",
            "namespace": "training",
            "labels": {L_JOBSET: job, L_RJOB: "node", L_INDEX: str(rank)},
        },
        "spec": {"containers": [{"name": "node", "image": "t5:1"}]},
        "status": {"phase": phase},
    }


def test_status_names_the_trainjob_and_why_it_cannot_show_more(tmp_path):
    stub = Stub()
    try:
        kc = stub.kubeconfig(tmp_path / "kubeconfig")
        stub.trainjobs[("training", "t5-x")] = {
            "apiVersion": f"{API_GROUP}/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "t5-x", "namespace": "training"},
        }
        stub.finish_as = ""  # no condition yet
        stub.pods = [pod("t5-x", 0, "Pending"), pod("t5-x", 1, "Pending"), pod("other", 0, "Running")]
        r = make_status(kc, JOB_NAME="t5-x", NAMESPACE="training")
        assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
        assert error(r) == (
            "error: TrainJob training/t5-x is Created and no pod runs to read "
            "/fsx/jobs/t5-x/metrics.jsonl from FSx (its pods: {'Pending': 2})"
        )
        r = make_status(kc, JOB_NAME="t5-y", NAMESPACE="training")
        assert r.returncode == 2 and error(r).startswith("error: no TrainJob training/t5-y: give --name"), r.stderr
        r = make_status(kc, NAMESPACE="training")
        assert r.returncode == 2 and "needs the TrainJob's name" in error(r)
    finally:
        stub.close()


def test_without_a_running_pod_the_trainjobs_own_trainer_status_is_shown(tmp_path):
    """What rank 0 reported into TrainJob.status.trainerStatus (training.job.trainer_status) is on the screen."""
    stub = Stub()
    try:
        kc = stub.kubeconfig(tmp_path / "kubeconfig")
        stub.finish_as = ""
        stub.trainjobs[("training", "t5-x")] = {
            "apiVersion": f"{API_GROUP}/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "t5-x", "namespace": "training"},
            "spec": {"trainer": {"numNodes": 3, "numProcPerNode": 8, "env": [{"name": "T5_SPARES", "value": "1"}]}},
            "status": {
                "conditions": [{"type": "Suspended", "status": "False"}],
                "trainerStatus": {
                    "progressPercentage": 42,
                    "estimatedRemainingSeconds": 3600,
                    "lastUpdatedTime": "2026-11-26T21:00:00Z",
                    "metrics": [
                        {"name": "step", "value": "840"},
                        {"name": "failures", "value": "1"},
                        {"name": "last_failure", "value": "killed (no end record)"},
                    ],
                },
            },
        }
        stub.pods = [pod("t5-x", 0, "Pending")]
        r = make_status(kc, JOB_NAME="t5-x", NAMESPACE="training")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "job      TrainJob training/t5-x: Created (no pod runs to read the metrics through)",
            "         pods: 1 Pending (numNodes 3, 1 spare(s) submitted)",
            "         trainerStatus: 42%, ETA 3600 s; step 840, failures 1 (updated 2026-11-26T21:00:00Z)",
        ]
    finally:
        stub.close()

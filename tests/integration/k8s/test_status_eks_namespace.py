"""`make status PLATFORM=eks` looks where `make train PLATFORM=eks` submits: with no NAMESPACE it reads the TrainJob
in the training namespace (cluster_facts.TRAINING_NAMESPACE, the submit's default), against the API server stub."""

from __future__ import annotations

from cluster_assets.k8s.schema import API_GROUP
from cluster_facts import TRAINING_NAMESPACE
from tests.integration.k8s.test_status_eks import error, make_status, pod
from tests.support.apiserver_stub import Stub
from tools.k8s.submit import build_parser


def test_without_namespace_status_reads_the_namespace_make_train_submits_to(tmp_path):
    assert build_parser().parse_args([]).namespace == TRAINING_NAMESPACE == "training"
    stub = Stub()
    try:
        kc = stub.kubeconfig(tmp_path / "kubeconfig")
        stub.trainjobs[(TRAINING_NAMESPACE, "t5-x")] = {
            "apiVersion": f"{API_GROUP}/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "t5-x", "namespace": TRAINING_NAMESPACE},
        }
        stub.finish_as = ""
        stub.pods = [pod("t5-x", 0, "Pending")]
        r = make_status(kc, JOB_NAME="t5-x", NAMESPACE="")  # unset and empty alike
        assert r.returncode == 2, r.stdout + r.stderr
        assert error(r).startswith("error: TrainJob training/t5-x is Created and no pod runs"), r.stderr
        # another namespace is still read when named
        r = make_status(kc, JOB_NAME="t5-x", NAMESPACE="default")
        assert r.returncode == 2 and error(r).startswith("error: no TrainJob default/t5-x"), r.stderr
    finally:
        stub.close()

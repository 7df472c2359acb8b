"""docs/deploy.md says where each platform's membership store is as the code has it: on ParallelCluster the stack's
etcd members (no head-node store, whose service is gone), with the submit's refusal and its opt-out; on EKS no
per-job store pod (the runtime has no store replicated job)."""

from __future__ import annotations

import re

from cluster_assets.k8s.runtime import build_cluster_training_runtime
from cluster_facts.names import ETCD_ENV_FILE
from tests.conftest import ROOT
from tools.slurm.membership import OPT_OUT_VAR

DEPLOY = (ROOT / "docs" / "deploy.md").read_text()


def failure_bullet(platform: str) -> str:
    """The "How a failure is survived" bullet of ``platform``, on one line."""
    m = re.search(rf"^\* \*\*{platform}\*\*: (.*?)(?=^\* |\Z)", DEPLOY, flags=re.M | re.S)
    assert m, f"no bullet for {platform}"
    return " ".join(m.group(1).split())


def test_parallelcluster_store_is_the_stacks_etcd_members_and_a_job_without_them_is_refused():
    bullet = failure_bullet("ParallelCluster")
    assert "head node" not in bullet.split("etcd")[0], bullet  # not "the store runs on the head node"
    assert "rendezvous store runs on the head node" not in DEPLOY
    assert "three-member etcd" in bullet and "`Etcd/Member0-2`" in bullet
    assert ETCD_ENV_FILE in bullet and f"`{OPT_OUT_VAR}=0`" in bullet


def test_no_store_pod_on_eks():
    runtime = build_cluster_training_runtime(
        name="t5-fault-tolerant", pvc_name="fsx-claim", image="img:1", max_restarts=10, gpus_per_node=8, efa_per_node=32
    )
    jobs = [j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    assert jobs == ["node"]  # the runtime has no store replicated job ...
    assert "store pod" not in DEPLOY  # ... and the deploy guide mentions none

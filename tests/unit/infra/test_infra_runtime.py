"""The fault-tolerant ClusterTrainingRuntime renderer (pure function, no CDK)."""

from __future__ import annotations

import json

import pytest

import re

from cluster_assets.k8s import etcd
from cluster_assets.k8s.runtime import build_cluster_training_runtime, replicated_job
from cluster_assets.k8s.schema import SchemaError, validate


def render(**overrides: object) -> dict:
    kwargs: dict = dict(
        name="t5-fault-tolerant",
        pvc_name="fsx-claim",
        image="example/t5:1",
        max_restarts=7,
        gpus_per_node=8,
        efa_per_node=32,
    )
    kwargs.update(overrides)
    return build_cluster_training_runtime(**kwargs)


def node_job(rt: dict) -> dict:
    return replicated_job(rt, "node")


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_round_trips_through_the_pinned_trainer_api() -> None:
    validate(render())
    validate(render(namespace="team-a", gpus_per_node=0, efa_per_node=0))
    json.dumps(render())  # plain JSON, ready for kubectl / add_manifest


def test_torch_runtime_shape_the_trainer_plugin_expects() -> None:
    rt = render()
    assert rt["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and rt["kind"] == "ClusterTrainingRuntime"
    assert "namespace" not in rt["metadata"]
    assert rt["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert rt["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    job = node_job(rt)
    assert job["name"] == "node"
    assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "node"


def test_no_store_job_membership_is_in_the_clusters_etcd() -> None:
    """Issue 33: the per-TrainJob store pod is gone; the training pods are the only replicated job and every one is
    pointed at the stack's etcd (its members' stable names, the agents' client Secret mounted read-only)."""
    rt = render(node_selector={"t5-failover/pool": "gpu"})
    assert [j["name"] for j in rt["spec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    job = node_job(rt)
    assert "dependsOn" not in job
    pod = job["template"]["spec"]["template"]
    assert pod["metadata"]["labels"] == {"t5-failover/component": "training"}  # what etcd's NetworkPolicy admits
    (c,) = pod["spec"]["containers"]
    env = env_of(c)
    assert env["T5_ETCD_ENDPOINTS"] == ",".join(f"https://etcd-{i}.etcd.t5-etcd.svc:2379" for i in range(3))
    assert "T5_RDZV_ENDPOINT" not in env
    (vol,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert vol["secret"] == {"secretName": "etcd-client", "defaultMode": 0o400}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount["readOnly"] and {env["T5_ETCD_CA"], env["T5_ETCD_CERT"], env["T5_ETCD_KEY"]} == {
        f"{mount['mountPath']}/{k}" for k in (etcd.CA_CERT, etcd.CLIENT_CERT, etcd.CLIENT_KEY)
    }
    # the job's own user, prefix and password come from the TrainJob (tests/unit/k8s/test_manifests.py)
    assert not {"T5_ETCD_USER", "T5_ETCD_PREFIX", "T5_ETCD_PASSWORD_FILE"} & set(env)


def test_one_rendezvous_per_jobset_attempt_from_the_pods_labels() -> None:
    (c,) = node_job(render())["template"]["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in c["env"]]
    # $(VAR) expands only from variables listed before its users
    assert names.index("JOBSET_NAME") < names.index("T5_RDZV_ID") and names.index(
        "JOBSET_RESTART_ATTEMPT"
    ) < names.index("T5_RDZV_ID")
    env = env_of(c)
    assert env["JOBSET_NAME"] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
    assert env["JOBSET_RESTART_ATTEMPT"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}
    }
    assert env["T5_RDZV_ID"] == "trainjob-$(JOBSET_NAME)-a$(JOBSET_RESTART_ATTEMPT)"


def test_the_launcher_takes_the_etcd_coordinator_from_the_runtime_env() -> None:
    """What config_from_pet makes of the runtime's env as the kubelet expands it: etcd, this attempt's id."""
    from training.launch.from_env import config_from_pet

    pet = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "job-a-node-0-0.job-a",
        "PET_MASTER_PORT": "29500",
    }
    env = env_of(node_job(render())["template"]["spec"]["template"]["spec"]["containers"][0])
    expanded = {
        k: v.replace("$(JOBSET_NAME)", "job-a").replace("$(JOBSET_RESTART_ATTEMPT)", "2")
        for k, v in env.items()
        if k.startswith("T5_") and isinstance(v, str)
    }
    cfg = config_from_pet(pet | expanded)
    assert cfg.coordinator == "etcd" and cfg.rdzv_id == "trainjob-job-a-a2" and not cfg.external_store


def test_per_index_retry_and_gang_restart_fallback() -> None:
    rt = render(max_restarts=7, retries_per_index=3)
    spec = rt["spec"]["template"]["spec"]
    policy = spec["failurePolicy"]
    assert policy["maxRestarts"] == 7 and policy["restartStrategy"] == "Recreate"
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["node"]}
    job_spec = node_job(rt)["template"]["spec"]
    assert job_spec["completionMode"] == "Indexed" and job_spec["backoffLimitPerIndex"] == 3
    assert job_spec["maxFailedIndexes"] == 0 and job_spec["podReplacementPolicy"] == "Failed"
    assert "backoffLimit" not in job_spec  # with backoffLimitPerIndex Kubernetes defaults it to "unlimited"
    assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
    rules = job_spec["podFailurePolicy"]["rules"]
    assert rules == [
        {"action": "Ignore", "onExitCodes": {"containerName": "node", "operator": "In", "values": [9]}},
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [2, 3, 4, 5, 7]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    by_name = {r["name"]: r for r in policy["rules"]}
    # no StoreLost / StoreDisrupted: losing an etcd member is no Job failure, and there is no store Job
    assert list(by_name) == ["NonRetryableExitCode", "NodeRetriesExhausted"]
    assert by_name["NonRetryableExitCode"]["action"] == "FailJobSet"
    assert by_name["NonRetryableExitCode"]["targetReplicatedJobs"] == ["node"]
    assert by_name["NodeRetriesExhausted"]["action"] == "RestartJobSet"
    assert "MaxFailedIndexesExceeded" in by_name["NodeRetriesExhausted"]["onJobFailureReasons"]
    # kubeflow/trainer#3737: a TTL makes the restart counter reset in a loop.
    assert "ttlSecondsAfterFinished" not in json.dumps(rt)


def test_non_retryable_patterns_match_the_job_controller_messages() -> None:
    rules = {r["name"]: r for r in render()["spec"]["template"]["spec"]["failurePolicy"]["rules"]}
    (exit_pattern,) = rules["NonRetryableExitCode"]["onJobFailureMessagePatterns"]
    # Messages as the Kubernetes Job controller words them for podFailurePolicy matches.
    assert re.search(
        exit_pattern,
        "Container node for pod training/t5-node-0-0-x failed with exit code 3 matching FailJob rule at index 0",
    )
    assert not re.search(
        exit_pattern,
        "Container node for pod training/t5-node-0-0-x failed with exit code 143 matching FailJob rule at index 0",
    )


def test_storage_shm_and_devices() -> None:
    pod = node_job(render())["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "fsx", "mountPath": "/fsx"} in container["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = env_of(container)
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    # a TrainJob that runs torchrun itself gets the launcher's rank assignment too (no gather through rank 0's store)
    assert env["TORCH_ELASTIC_WORKER_IDENTICAL"] == "1"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env  # only for types with GPUDirect RDMA
    rdma = node_job(render(gpudirect_rdma=True))["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"} in rdma


def test_in_memory_snapshots_live_on_the_node_and_outlive_the_recreated_pods() -> None:
    pod = node_job(render())["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (vol,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert vol["hostPath"] == {"path": "/dev/shm/t5-failover", "type": "DirectoryOrCreate"}  # the node's tmpfs
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == vol["name"]]
    env = env_of(container)
    assert env["T5F_MEMORY_DIR"] == mount["mountPath"]  # the training job writes its snapshots there
    assert not mount["mountPath"].startswith("/dev/shm")  # not hidden under the pod's own /dev/shm


def test_cpu_variant_has_no_device_requests() -> None:
    rt = render(gpus_per_node=0, efa_per_node=0, namespace="ci")
    assert rt["kind"] == "TrainingRuntime" and rt["metadata"]["namespace"] == "ci"
    pod = node_job(rt)["template"]["spec"]["template"]["spec"]
    assert "resources" not in pod["containers"][0] and "tolerations" not in pod
    assert "FI_" not in json.dumps(pod) and "NCCL_" not in json.dumps(pod)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"env": {"PET_NNODES": "2"}}, "PET_"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"pvc_name": ""}, "pvc_name"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"retries_per_index": -1}, "retries_per_index"),
        ({"env": {"JOBSET_NAME": "x"}}, "JOBSET_NAME"),
        ({"env": {"T5_ETCD_ENDPOINTS": "https://elsewhere:2379"}}, "T5_ETCD_ENDPOINTS"),
        ({"env": {"T5_RDZV_ID": "x"}}, "T5_RDZV_ID"),
        ({"termination_grace_period_s": 5}, "termination_grace_period_s"),
        ({"efa_per_node": 0, "gpudirect_rdma": True}, "gpudirect_rdma"),
    ],
)
def test_bad_arguments_are_rejected(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(**overrides)


def test_schema_check_catches_a_field_from_another_trainer_line() -> None:
    rt = render()
    rt["spec"]["podTemplateOverrides"] = []  # v2.1 API, gone in 2.2+
    with pytest.raises(SchemaError, match="podTemplateOverrides"):
        validate(rt)

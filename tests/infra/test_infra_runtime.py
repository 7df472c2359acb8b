"""The fault-tolerant ClusterTrainingRuntime renderer (pure function, no CDK)."""
from __future__ import annotations

import json

import pytest

import re

from cluster_assets.k8s.runtime import STORE_PORT, build_cluster_training_runtime, replicated_job
from cluster_assets.k8s.schema import SchemaError, validate


def render(**overrides: object) -> dict:
    kwargs: dict = dict(name="t5-fault-tolerant", pvc_name="fsx-claim", image="example/t5:1", max_restarts=7,
                        gpus_per_node=8, efa_per_node=32)
    kwargs.update(overrides)
    return build_cluster_training_runtime(**kwargs)


def node_job(rt: dict) -> dict:
    return replicated_job(rt, "node")


def store_job(rt: dict) -> dict:
    return replicated_job(rt, "store")


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


def test_store_is_its_own_cpu_job_on_the_system_nodes() -> None:
    rt = render(store_node_selector={"t5-failover/pool": "system"}, node_selector={"t5-failover/pool": "gpu"})
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["store", "node"]  # dependsOn may only name the previous job
    store = store_job(rt)
    assert store["replicas"] == 1 and "labels" not in (store["template"].get("metadata") or {})  # no Trainer ancestor
    spec = store["template"]["spec"]
    assert spec["parallelism"] == spec["completions"] == 1 and spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == {"t5-failover/component": "rdzv-store"}
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"t5-failover/pool": "system"}
    assert "tolerations" not in pod and "volumes" not in pod
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "training.rdzv_store", "--host", "0.0.0.0", "--port", str(STORE_PORT),
                            "--job-id", "trainjob-$(JOBSET_NAME)"]
    assert env_of(c)["JOBSET_NAME"] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
    assert c["ports"] == [{"name": "rdzv", "containerPort": STORE_PORT, "protocol": "TCP"}]
    assert c["readinessProbe"]["tcpSocket"] == {"port": "rdzv"}
    assert "nvidia.com/gpu" not in json.dumps(c) and c["resources"]["requests"]["cpu"] == "250m"
    assert c["image"] == "example/t5:1"


def test_training_pods_use_the_store_and_start_after_it() -> None:
    job = node_job(render())
    assert job["dependsOn"] == [{"name": "store", "status": "Ready"}]
    pod = job["template"]["spec"]["template"]
    assert pod["metadata"]["labels"] == {"t5-failover/component": "training"}
    (c,) = pod["spec"]["containers"]
    names = [e["name"] for e in c["env"]]
    # $(JOBSET_NAME) expands only from variables listed before its users
    assert names.index("JOBSET_NAME") < names.index("T5_RDZV_ENDPOINT") and names.index("JOBSET_NAME") < names.index(
        "T5_RDZV_ID")
    env = env_of(c)
    assert env["JOBSET_NAME"] == env_of(store_job(render())["template"]["spec"]["template"]["spec"]["containers"][0])[
        "JOBSET_NAME"]
    # JobSet pod DNS: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain = jobset name>
    assert env["T5_RDZV_ENDPOINT"] == f"$(JOBSET_NAME)-store-0-0.$(JOBSET_NAME):{STORE_PORT}"
    # the launcher's own default id for a TrainJob (training.launch.from_env) and the store's --job-id
    assert env["T5_RDZV_ID"] == "trainjob-$(JOBSET_NAME)"


def test_rdzv_id_is_the_one_the_launcher_derives_from_pet() -> None:
    """T5_RDZV_ID as the kubelet expands it == what config_from_pet would derive without it."""
    from training.launch.from_env import config_from_pet
    pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "job-a-node-0-0.job-a",
           "PET_MASTER_PORT": "29500"}
    env = env_of(node_job(render())["template"]["spec"]["template"]["spec"]["containers"][0])
    expanded = {k: v.replace("$(JOBSET_NAME)", "job-a") for k, v in env.items() if k.startswith("T5_RDZV")}
    derived = config_from_pet(pet)
    cfg = config_from_pet(pet | expanded)
    assert cfg.rdzv_id == derived.rdzv_id == "trainjob-job-a"
    assert cfg.rdzv_endpoint == f"job-a-store-0-0.job-a:{STORE_PORT}" and cfg.external_store


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
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [2, 3, 4, 5, 7]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    by_name = {r["name"]: r for r in policy["rules"]}
    assert list(by_name) == ["NonRetryableExitCode", "NodeRetriesExhausted", "StoreDisrupted", "StoreLost"]
    assert by_name["NonRetryableExitCode"]["action"] == "FailJobSet"
    assert by_name["NonRetryableExitCode"]["targetReplicatedJobs"] == ["node"]
    assert by_name["NodeRetriesExhausted"]["action"] == "RestartJobSet"
    assert "MaxFailedIndexesExceeded" in by_name["NodeRetriesExhausted"]["onJobFailureReasons"]
    assert by_name["StoreDisrupted"]["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert by_name["StoreLost"] == {"name": "StoreLost", "action": "RestartJobSet", "targetReplicatedJobs": ["store"]}
    # kubeflow/trainer#3737: a TTL makes the restart counter reset in a loop.
    assert "ttlSecondsAfterFinished" not in json.dumps(rt)


def test_non_retryable_patterns_match_the_job_controller_messages() -> None:
    rules = {r["name"]: r for r in render()["spec"]["template"]["spec"]["failurePolicy"]["rules"]}
    (exit_pattern,) = rules["NonRetryableExitCode"]["onJobFailureMessagePatterns"]
    (disruption,) = rules["StoreDisrupted"]["onJobFailureMessagePatterns"]
    # Messages as the Kubernetes Job controller words them for podFailurePolicy matches.
    assert re.search(exit_pattern, "Container node for pod training/t5-node-0-0-x failed with exit code 3 "
                                   "matching FailJob rule at index 0")
    assert not re.search(exit_pattern, "Container node for pod training/t5-node-0-0-x failed with exit code 143 "
                                       "matching FailJob rule at index 0")
    assert re.search(disruption, "Pod training/t5-store-0-0-x has condition DisruptionTarget matching FailJob "
                                 "rule at index 0")


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


@pytest.mark.parametrize("overrides,message", [
    ({"env": {"PET_NNODES": "2"}}, "PET_"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"pvc_name": ""}, "pvc_name"),
    ({"num_nodes": 0}, "num_nodes"),
    ({"retries_per_index": -1}, "retries_per_index"),
    ({"env": {"JOBSET_NAME": "x"}}, "JOBSET_NAME"),
    ({"termination_grace_period_s": 5}, "termination_grace_period_s"),
    ({"efa_per_node": 0, "gpudirect_rdma": True}, "gpudirect_rdma"),
])
def test_bad_arguments_are_rejected(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(**overrides)


def test_schema_check_catches_a_field_from_another_trainer_line() -> None:
    rt = render()
    rt["spec"]["podTemplateOverrides"] = []  # v2.1 API, gone in 2.2+
    with pytest.raises(SchemaError, match="podTemplateOverrides"):
        validate(rt)

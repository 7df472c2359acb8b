"""The fault-tolerant ClusterTrainingRuntime renderer (pure function, no CDK)."""
from __future__ import annotations

import json

import pytest

from cluster_assets.k8s.runtime import build_cluster_training_runtime
from cluster_assets.k8s.schema import SchemaError, validate


def render(**overrides: object) -> dict:
    kwargs: dict = dict(name="t5-fault-tolerant", pvc_name="fsx-claim", image="example/t5:1", max_restarts=7,
                        gpus_per_node=8, efa_per_node=32)
    kwargs.update(overrides)
    return build_cluster_training_runtime(**kwargs)


def node_job(rt: dict) -> dict:
    (job,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    return job


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


def test_restart_policy_recreates_the_whole_job() -> None:
    rt = render(max_restarts=7)
    policy = rt["spec"]["template"]["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 7 and policy["restartStrategy"] == "Recreate"
    job_spec = node_job(rt)["template"]["spec"]
    assert job_spec["backoffLimit"] == 0
    assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
    rules = job_spec["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    assert {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [2, 3, 4, 5, 7]}} in rules
    by_name = {r["name"]: r for r in policy["rules"]}
    assert by_name["NonRetryableExitCode"]["action"] == "FailJobSet"
    assert by_name["InfrastructureDisruption"]["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    # kubeflow/trainer#3737: a TTL makes the restart counter reset in a loop.
    assert "ttlSecondsAfterFinished" not in json.dumps(rt)


def test_non_retryable_patterns_match_the_job_controller_messages() -> None:
    import re

    rules = {r["name"]: r for r in render()["spec"]["template"]["spec"]["failurePolicy"]["rules"]}
    (exit_pattern,) = rules["NonRetryableExitCode"]["onJobFailureMessagePatterns"]
    (disruption,) = rules["InfrastructureDisruption"]["onJobFailureMessagePatterns"]
    # Messages as the Kubernetes Job controller words them for podFailurePolicy matches.
    assert re.search(exit_pattern, "Container node for pod training/t5-node-0-0-x failed with exit code 3 "
                                   "matching FailJob rule at index 0")
    assert not re.search(exit_pattern, "Container node for pod training/t5-node-0-0-x failed with exit code 143 "
                                       "matching FailJob rule at index 0")
    assert re.search(disruption, "Pod training/t5-node-0-0-x has condition DisruptionTarget matching FailJob "
                                 "rule at index 1")


def test_storage_shm_and_devices() -> None:
    pod = node_job(render())["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "fsx", "mountPath": "/fsx"} in container["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e["value"] for e in container["env"]}
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
    env = {e["name"]: e["value"] for e in container["env"]}
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

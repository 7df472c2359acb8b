"""Every image a job pulls is the tag `make image` pushes, and a pod that cannot start is named with its fix.

The pod-status logic runs on real ``kubernetes`` client model objects (what ``list_namespaced_pod`` returns)."""

from __future__ import annotations

import json

import yaml
from kubernetes import client as k

from cluster_assets.k8s.runtime import NODE, container_images
from tests.support.k8s import CPU_SHAPE, submit_cli
from tools.image_tag import source_tag
from tools.k8s.cluster import pod_start_problem

REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5ft/t5-train"


def test_every_image_of_the_rendered_runtime_and_trainjob_is_the_tag_make_image_pushes(tmp_path):
    # The offline render a user does with the deploy's outputs (`cdk deploy --outputs-file`): the TrainJob's image
    # and every container of the runtime are <EcrRepositoryUri>:<this checkout's tag>,
    # the tag scripts/image.sh pushes (tools.image_tag); validated with the pinned Trainer API models.
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"t5ft-storage": {"EcrRepositoryUri": REPO}}))
    env = {"PATH": "/usr/bin:/bin"}
    r = submit_cli("--dry-run", "--print-runtime", "--outputs-file", str(outputs), "--name", "img", *CPU_SHAPE, env=env)
    assert r.returncode == 0, r.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(r.stdout)}
    pushed = f"{REPO}:{source_tag()}"
    assert docs["TrainJob"]["spec"]["trainer"]["image"] == pushed
    images = container_images(docs["ClusterTrainingRuntime"])
    assert set(images) == {f"{NODE}/{NODE}"} and set(images.values()) == {pushed}


def pod(
    rjob: str, *, waiting: tuple[str, str] | None = None, unscheduled: str | None = None, running: bool = False
) -> k.V1Pod:
    statuses = [
        k.V1ContainerStatus(
            name=rjob,
            image="ignored",
            image_id="",
            ready=running,
            restart_count=0,
            state=k.V1ContainerState(waiting=k.V1ContainerStateWaiting(reason=waiting[0], message=waiting[1]))
            if waiting
            else k.V1ContainerState(running=k.V1ContainerStateRunning()),
        )
    ]
    conditions = (
        [k.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=unscheduled)]
        if unscheduled
        else None
    )
    return k.V1Pod(
        metadata=k.V1ObjectMeta(
            name=f"job-{rjob}-0-0-abcde",
            labels={"jobset.sigs.k8s.io/jobset-name": "job", "jobset.sigs.k8s.io/replicatedjob-name": rjob},
        ),
        spec=k.V1PodSpec(containers=[k.V1Container(name=rjob, image=f"{REPO}:{rjob}-tag")]),
        status=k.V1PodStatus(
            phase="Running" if running else "Pending", container_statuses=statuses, conditions=conditions
        ),
    )


def test_a_training_pod_without_its_image_names_make_image():
    p = pod_start_problem(pod("node", waiting=("ErrImagePull", "not found")), "training", "job")
    assert p.fatal and f"the image {REPO}:node-tag is missing or not pullable: push it with `make image`" in p.line


def test_a_broken_container_config_is_fatal_and_says_where_to_look():
    p = pod_start_problem(
        pod("node", waiting=("CreateContainerConfigError", 'configmap "c" not found')), "training", "job"
    )
    assert p.fatal and p.reason == "CreateContainerConfigError"
    assert "`kubectl describe pod -n training job-node-0-0-abcde` says which" in p.line


def test_an_unschedulable_pod_is_reported_but_may_still_start():
    p = pod_start_problem(
        pod("node", unscheduled="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."), "training", "job"
    )
    assert not p.fatal and p.reason == "Unschedulable"
    assert p.line.startswith(
        "pod job-node-0-0-abcde is not scheduled yet: 0/3 nodes are available: 3 "
        "Insufficient nvidia.com/gpu.; it starts once GPU nodes"
    )


def test_pods_that_start_or_pull_have_no_problem():
    assert pod_start_problem(pod("node", running=True), "training", "job") is None
    assert pod_start_problem(pod("node", waiting=("ContainerCreating", "")), "training", "job") is None

"""Rendered TrainJob/runtime validate against the pinned Trainer API models; bad inputs fail clearly."""

from __future__ import annotations

import copy
import os

import pytest
import yaml

from cluster_assets.k8s import schema
from cluster_assets.k8s.runtime import build_cluster_training_runtime, replicated_job
from cluster_assets.k8s.trainjob import TrainJobConfig, TrainJobError, train_job_manifest
from cluster_facts import platform_timeouts
from tests.support.k8s import CPU_SHAPE, submit_cli


def cfg(**kw) -> TrainJobConfig:
    base = dict(
        name="t5-base-test",
        namespace="training",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:1",
        runtime_name="t5-fault-tolerant",
        fsx_mount_path="/fsx",
    )
    return TrainJobConfig(**{**base, **kw})


def gpu_runtime() -> dict:
    return build_cluster_training_runtime(
        name="t5-fault-tolerant", pvc_name="fsx-claim", image="img:1", max_restarts=10, gpus_per_node=8, efa_per_node=32
    )


# ------------------------------------------------------------------------------------------ round trips
def test_gpu_trainjob_round_trips_and_says_what_it_should():
    tj = train_job_manifest(cfg(num_nodes=4, training_args=("--train.steps", "100")))
    typed = schema.roundtrip(tj)
    tr = typed.spec.trainer
    assert tr.num_nodes == 4 and tr.num_proc_per_node == 8
    assert tr.command[:5] == ["python", "-m", "training.launch", "--from-env", "pet"]
    assert "$(PET_NNODES)" in tr.command  # fixed world size, expanded by the kubelet
    assert tr.args[:4] == ["--preset", "t5-base", "--job.out_dir", "/fsx/jobs/t5-base-test"]
    limits = tj["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert limits == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "5120Mi"}
    assert typed.spec.runtime_ref.name == "t5-fault-tolerant"
    assert "backoffLimit" not in str(tj)  # TrainJob has no such field (the runtime owns failure handling)


def test_command_parses_with_the_real_launcher_and_waits_for_replacement_nodes():
    from training.launch import build_parser, config_from_args, rdzv_conf

    pet = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "8",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "job-node-0-0.job",
        "PET_MASTER_PORT": "29400",
    }

    def launcher_conf(**kw) -> dict:
        command, args = (train_job_manifest(cfg(**kw))["spec"]["trainer"][k] for k in ("command", "args"))
        argv = [pet["PET_NNODES"] if a == "$(PET_NNODES)" else a for a in command[3:]] + args
        return dict(
            kv.split("=") for kv in rdzv_conf(config_from_args(build_parser().parse_args(argv), pet)).split(",")
        )

    eks = platform_timeouts("eks")
    assert launcher_conf()["join_timeout"] == str(eks.rdzv_join_timeout_s)  # image pull on a replacement node
    assert eks.rdzv_join_timeout_s > 120  # the launcher's own default is too short for that
    assert launcher_conf(launcher_args=("--join-timeout", "900"))["join_timeout"] == "900"  # the user's wins
    command, args = (train_job_manifest(cfg())["spec"]["trainer"][k] for k in ("command", "args"))
    argv = [pet["PET_NNODES"] if a == "$(PET_NNODES)" else a for a in command[3:]] + args
    launch = config_from_args(build_parser().parse_args(argv), pet)
    # the agent waits for a checkpoint-on-SIGTERM as long as the EKS table says (the pod grace period is longer)
    assert (
        launch.shutdown_timeout_s
        == eks.shutdown_timeout_s
        < replicated_job(gpu_runtime(), "node")["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    assert launch.train_timeout_s == eks.train_pg_timeout_s  # no longer 0 (= "whatever the preset says")


def test_hot_spare_pods_train_on_nodes_and_wait_in_the_rendezvous():
    """--spares 1 on a 2-node job: 3 pods; the real launcher, fed each pod's PET_* and the rendered env, trains on
    2 fixed nodes (MIN = MAX = 2) and knows the third agent is a spare."""
    from training.launch import build_parser, config_from_args
    from training.launch.commands import torchrun_argv

    tj = train_job_manifest(cfg(num_nodes=2, spares=1))
    tr = tj["spec"]["trainer"]
    assert tr["numNodes"] == 3 and {"name": "T5_SPARES", "value": "1"} in tr["env"]
    assert "$(PET_NNODES)" not in tr["command"]  # numNodes counts the spares: MIN is the training pods
    pet = {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "8",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "j-node-0-0.j",
        "PET_MASTER_PORT": "29400",
        **{e["name"]: e["value"] for e in tr["env"]},
        # the runtime's env (the pod gets the runtime's and the TrainJob's): the jobs' etcd, as the stack runs it
        "T5_ETCD_ENDPOINTS": "https://etcd-0.etcd.t5-etcd.svc:2379",
    }
    launch = config_from_args(build_parser().parse_args(tr["command"][3:] + tr["args"]), pet)
    assert (launch.min_nodes, launch.max_nodes, launch.spares) == (2, 2, 1)
    assert "--nnodes=2:2" in torchrun_argv(launch)  # the spare agent is just one more agent on that line
    plain = train_job_manifest(cfg(num_nodes=2))["spec"]["trainer"]
    assert plain["numNodes"] == 2 and "$(PET_NNODES)" in plain["command"]
    assert not any(e["name"] == "T5_SPARES" for e in plain["env"])


def test_shipped_runtime_round_trips():
    schema.roundtrip(gpu_runtime())


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["spec"]["trainer"].update(numNode=2), r"spec.trainer.numNode: unknown field"),
        (lambda d: d["spec"].update(podTemplateOverrides=[]), r"spec.podTemplateOverrides: unknown field"),  # v2.1
        (lambda d: d["spec"].update(backoffLimit=3), r"spec.backoffLimit: unknown field"),
        (lambda d: d["spec"]["trainer"].update(numNodes="2"), r"numNodes"),
        (lambda d: d["spec"]["trainer"].update(numProcPerNode="auto"), r"numProcPerNode"),  # int since v2.2
        (lambda d: d.update(apiVersion="kubeflow.org/v1"), r"apiVersion"),
        (lambda d: d.update(kind="PyTorchJob"), r"kind"),
        (lambda d: d["spec"]["runtimeRef"].pop("name"), r"RuntimeRef.name"),
    ],
)
def test_schema_rejects(mutate, match):
    tj = copy.deepcopy(train_job_manifest(cfg()))
    mutate(tj)
    with pytest.raises(schema.SchemaError, match=match):
        schema.roundtrip(tj)


@pytest.mark.parametrize(
    "job, field, index",
    [("node", "backofLimit", 0), ("node", "backoffLimitPerindex", 0), ("node", "maxFailedIndex", 0)],
)
def test_schema_rejects_unknown_runtime_field(job, field, index):
    rt = gpu_runtime()
    replicated_job(rt, job)["template"]["spec"][field] = 0
    with pytest.raises(schema.SchemaError, match=rf"replicatedJobs\[{index}\].template.spec.{field}: unknown field"):
        schema.roundtrip(rt)


def test_printed_runtime_pairs_with_the_trainjob():
    """`--print-runtime` renders the training pods only (no store job), pointed at the cluster's etcd; the TrainJob
    carries its own etcd user and prefix and mounts its password Secret through a runtime patch of that same
    replicated job and container."""
    r = submit_cli("--dry-run", "--print-runtime", "--name", "t5-" + "x" * 37, "--image", "reg/t5:abc", *CPU_SHAPE)
    assert r.returncode == 0, r.stderr
    rt, tj = (d for d in yaml.safe_load_all(r.stdout) if d["kind"] in ("ClusterTrainingRuntime", "TrainJob"))
    assert [j["name"] for j in rt["spec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    name = tj["metadata"]["name"]
    env = {e["name"]: e["value"] for e in tj["spec"]["trainer"]["env"]}
    assert env["T5_ETCD_USER"] == f"job-{name}" and env["T5_ETCD_PREFIX"] == f"/t5-failover/jobs/{name}/"
    (patch,) = tj["spec"]["runtimePatches"]
    (rjp,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjp["template"]["spec"]["template"]["spec"]
    assert rjp["name"] == "node" and pod["volumes"] == [
        {"name": "etcd-job", "secret": {"secretName": f"{name}-etcd", "defaultMode": 0o400}}
    ]
    (ctr,) = pod["containers"]
    (mount,) = ctr["volumeMounts"]
    assert ctr["name"] == "node" and env["T5_ETCD_PASSWORD_FILE"] == f"{mount['mountPath']}/password"
    assert len(f"{name}-etcd") <= 253 and len(f"etcd-add-{name}") <= 63  # Secret and add-job Job names
    schema.roundtrip(rt)
    schema.roundtrip(tj)


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(name="T5_Job"), "name 'T5_Job' is not valid"),
        (dict(name="t5-" + "x" * 40), "at most 40"),
        (dict(num_nodes=0), "--nodes 0 is invalid"),
        (dict(nproc_per_node=0), "--nproc-per-node 0 is invalid"),
        (dict(nproc_per_node=16), "each worker needs its own GPU"),
        (dict(gpus_per_node=-1), "--gpus-per-node -1"),
        (dict(image=""), "pass --image"),
        (dict(memory_request="lots"), "not a Kubernetes quantity"),
        (dict(memory_request=""), "memory request with hugepages"),
        (dict(env=(("PET_NNODES", "3"),)), "PET_NNODES is reserved"),
        (dict(spares=-1), "--spares -1 is invalid"),
        (dict(env=(("T5_SPARES", "1"),)), "pass --spares instead"),
        (dict(env=(("T5_ETCD_USER", "root"),)), "T5_ETCD_USER is set by the runtime or the job's etcd credentials"),
        (dict(env=(("T5_RDZV_ID", "x"),)), "T5_RDZV_ID is set by the runtime"),
        (dict(training_args=("--job.out_dir", "/tmp/x")), "submit with the same --name"),
        (dict(fsx_mount_path="fsx"), "must be absolute"),
    ],
)
def test_bad_settings_are_named(kw, match):
    with pytest.raises(TrainJobError, match=match):
        train_job_manifest(cfg(**kw))


# ------------------------------------------------------------------------------------------------- CLI
def test_dry_run_prints_a_valid_trainjob_offline(tmp_path):
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "DRY_RUN": "1", "NODES": "2"}
    r = submit_cli("--image", "img:1", env=env)
    assert r.returncode == 0, r.stderr
    (tj,) = list(yaml.safe_load_all(r.stdout))
    schema.roundtrip(tj)
    assert tj["spec"]["trainer"]["numNodes"] == 2 and tj["metadata"]["namespace"] == "training"


def test_dry_run_without_image_uses_a_marked_placeholder():
    r = submit_cli("--dry-run")
    assert r.returncode == 0
    assert "placeholder image" in r.stderr
    schema.roundtrip(yaml.safe_load(r.stdout))


def test_training_flags_pass_through_without_dashes():
    r = submit_cli("--dry-run", "--image", "img:1", "--train.steps", "50", "--", "--checkpoint.interval", "5")
    assert r.returncode == 0, r.stderr
    args = yaml.safe_load(r.stdout)["spec"]["trainer"]["args"]
    assert args[-4:] == ["--train.steps", "50", "--checkpoint.interval", "5"]


@pytest.mark.parametrize(
    "args, match",
    [
        (["--nodes", "3", *CPU_SHAPE[2:], "--", "--train.global_batch", "8"], "not divisible by the world size 3"),
        (["--", "--train.stepz", "5"], "training arguments rejected"),
        (["--", "--config", "/home/me/job.toml"], "put the TOML on FSx"),
        (["--bogus"], "unknown option --bogus"),
        (["--nodes", "0"], "--nodes 0 is invalid"),
        (["--instance-type", "p3.2xlarge"], "unknown; use one of"),
        (["--env", "NOEQUALS"], "expected NAME=VALUE"),
        (
            ["--preset", "t5-base", "--gpus-per-node", "0", "--nproc-per-node", "1"],
            "preset 't5-base' trains on CUDA GPUs, but the job asks for no GPUs per node; pass --instance-type",
        ),
    ],
)
def test_cli_rejects_bad_input(args, match):
    r = submit_cli("--dry-run", "--image", "img:1", *args)
    assert r.returncode == 2
    assert match in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args, env, line",
    [
        # named as typed: the submit derives --nproc-per-node from it (it said "--nproc-per-node -1")
        (["--gpus-per-node", "-1"], {}, "error: --gpus-per-node -1 is invalid: must be an integer >= 0"),
        # a negative value of a training flag is its value (argparse read "-1" as an unknown option), then validated
        (["--train.steps", "-1"], {}, "error: training arguments rejected: train.steps=-1 must be > 0"),
        (["--max-restarts", "-1", "--print-runtime"], {}, "error: --max-restarts -1: use 0 or more"),
        (["--max-restarts", "5"], {}, "error: --max-restarts 5 changes nothing without --print-runtime"),
        (["--image-tag", "bad tag!"], {}, "error: --image-tag='bad tag!' is not a valid image tag"),
        ([], {"IMAGE_TAG": "bad tag!"}, "error: IMAGE_TAG='bad tag!' is not a valid image tag: use up to 128 letters"),
    ],
)
def test_bad_values_are_one_line_naming_what_was_given(args, env, line):
    base = {
        k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "NODES", "NPROC", "PRESET", "SPARES", "IMAGE_TAG")
    }
    r = submit_cli("--dry-run", *args, env={**base, **env})
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith(line) and r.stderr.count("\n") == 1, r.stderr


def test_a_valid_image_tag_passes():
    r = submit_cli("--dry-run", "--image-tag", "v1.2_rc-3")
    assert r.returncode == 0, r.stderr
    assert "<the installed runtime's ECR repository>:v1.2_rc-3" in r.stderr  # the tag a submission would use


def test_cluster_paths_are_not_checked_locally():
    r = submit_cli("--dry-run", "--image", "img:1", "--", "--data.source", "/fsx/data/c4")
    assert r.returncode == 0, r.stderr


def test_image_from_cdk_outputs(tmp_path):
    out = tmp_path / "cdk-outputs.json"
    out.write_text(
        '{"t5ft-eks": {"ClusterName": "t5ft", "EcrRepositoryUri": '
        '"123456789012.dkr.ecr.us-west-2.amazonaws.com/t5ft-train", "TrainingNamespace": "team-a", '
        '"RuntimeName": "t5-ft-b", "GpuInstanceType": "p4d.24xlarge"}}'
    )
    r = submit_cli("--dry-run", "--outputs-file", str(out), "--image-tag", "abc123")
    assert r.returncode == 0, r.stderr
    tj = yaml.safe_load(r.stdout)
    assert tj["spec"]["trainer"]["image"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/t5ft-train:abc123"
    assert tj["metadata"]["namespace"] == "team-a" and tj["spec"]["runtimeRef"]["name"] == "t5-ft-b"
    assert tj["spec"]["trainer"]["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == "4"  # p4d
    r = submit_cli("--dry-run", "--outputs-file", str(out), "--namespace", "mine")  # explicit flags win
    assert yaml.safe_load(r.stdout)["metadata"]["namespace"] == "mine"

"""Batch-script renderer and submit CLI: what the script contains, that it is valid bash, bad inputs rejected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster_assets.slurm.config import SlurmConfigError, SlurmJobConfig, parse_time_limit
from cluster_assets.slurm.render import render
from tools.slurm import submit
from tools.slurm.slurmctl import parse_job

BASE = SlurmJobConfig(shared_dir="/fsx", run_name="r1")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"nodes": 0}, "nodes="),
        ({"run_name": "a/b"}, "run_name="),
        ({"preset": "../x"}, "preset="),
        ({"time_limit": "soon"}, "time_limit="),
        ({"time_limit": "5", "signal_before_timeout_s": 300}, "signal_before_timeout_s=300 is not shorter"),
        ({"signal_before_timeout_s": 0}, "signal_before_timeout_s="),
        ({"shutdown_timeout_s": 600}, "beyond shutdown_timeout_s=600"),  # the time limit would cut the save off
        ({"gpus_per_node": 8, "gpudirect_rdma": True}, "gpudirect_rdma=True"),
        ({"instance_type": "p9.huge"}, "instance_type='p9.huge'"),
        ({"gpus_per_node": 2, "nproc_per_node": 4}, "nproc_per_node=4"),
        ({"efa": True}, "efa=True"),
        ({"shared_dir": "fsx"}, "shared_dir='fsx'"),
        ({"repo_dir": "/my repo"}, "repo_dir="),
        ({"python": "python3"}, "python="),
        ({"train_args": ("--checkpoint.dir", "/tmp/x")}, "--checkpoint.dir is set by the job"),
        ({"train_args": ("--job.out_dir=/tmp/x",)}, "--job.out_dir is set by the job"),
        ({"train_args": ("--preset", "t5-base")}, "preset setting"),
        ({"extra_sbatch": ("--account ml",)}, "extra_sbatch="),
        ({"extra_env": ("1BAD=x",)}, "extra_env="),
        ({"container_mounts": ("fsx:/fsx",)}, "container_mounts="),
        ({"container_image": "has space"}, "container_image="),
        ({"rdzv_port": 80}, "rdzv_port=80"),
        ({"rdzv_store": "head node"}, "rdzv_store='head node'"),
        ({"rdzv_store_port": 0}, "rdzv_store_port=0"),
        ({"spares": -1}, "spares=-1"),
        ({"max_requeues": -1}, "max_requeues=-1"),
        ({"step_timeout_s": 5}, "step_timeout_s=5"),
        ({"slurm_conf": "etc/slurm.conf"}, "slurm_conf="),
        ({"etcd_env": "job.env"}, "etcd_env='job.env'"),
    ],
)
def test_bad_settings_are_rejected_naming_the_value(change, field):
    with pytest.raises(SlurmConfigError) as e:
        render(replace(BASE, **change))
    assert field in str(e.value)


def test_time_limit_parsing():
    assert parse_time_limit("30") == 1800
    assert parse_time_limit("10:30") == 630
    assert parse_time_limit("04:00:00") == 14400
    assert parse_time_limit("2-00") == 172800
    assert parse_time_limit("1-02:03:04") == 93784
    assert replace(BASE, time_limit="1:00:00").srun_timeout_s == 3600 + 600
    with pytest.raises(SlurmConfigError, match="not a Slurm time"):
        parse_time_limit("1h")


def test_toml_config(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[slurm]\nnodes = 4\ninstance_type = "p4d.24xlarge"\nshared_dir = "/fsx"\nextra_env = ["A=1"]\n')
    cfg = SlurmJobConfig.from_toml(f).with_instance_type().validate()
    assert (cfg.nodes, cfg.gpus_per_node, cfg.gpudirect_rdma, cfg.extra_env) == (4, 8, True, ("A=1",))
    f.write_text("[slurm]\nnodez = 4\n")
    with pytest.raises(SlurmConfigError, match="unknown setting 'nodez'"):
        SlurmJobConfig.from_toml(f)
    f.write_text('[slurm]\nnodes = "4"\n')
    with pytest.raises(SlurmConfigError, match="nodes='4' .* must be an integer"):
        SlurmJobConfig.from_toml(f)


def test_submit_argument_split_and_environment_defaults():
    ours, train = submit.split_args(
        [
            "--nodes",
            "4",
            "--train.steps",
            "9",
            "--config=x.toml",
            "--no-follow",
            "--parallel.precision=bf16",
            "--",
            "--train.lr",
            "1e-4",
        ]
    )
    assert ours == ["--nodes", "4", "--no-follow"]
    assert train == ["--train.steps", "9", "--config=x.toml", "--parallel.precision=bf16", "--train.lr", "1e-4"]
    assert submit.env_args({"NODES": "3", "PRESET": "t5-base", "DRY_RUN": "1", "UNRELATED": "x"}) == [
        "--preset",
        "t5-base",
        "--nodes",
        "3",
        "--dry-run",
    ]


def test_parse_scontrol_job_line():
    line = (
        "JobId=12 JobName=chaos-a UserId=root(0) JobState=PENDING Reason=BeginTime Dependency=(null) "
        "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 NodeList=n[1-2] BatchHost=n1 "
        "TRES=cpu=4,mem=2000M,node=2 Command=/x/job.sbatch"
    )
    info = parse_job(line)
    assert (info.job_id, info.state, info.reason, info.restarts, info.node_list, info.batch_host) == (
        12,
        "PENDING",
        "BeginTime",
        1,
        "n[1-2]",
        "n1",
    )
    assert not info.terminal and info.fields["TRES"] == "cpu=4,mem=2000M,node=2"
    assert parse_job(line.replace("PENDING", "COMPLETED")).succeeded

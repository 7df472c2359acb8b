"""The checks before any process starts (training.job.check): each kind of bad data, location and device is
one message naming the value and the fix, from every start path (agent, launcher, python -m training, Slurm
submit), with the exit code of the README's table and no worker started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, TINY
from training.job import check as job_check
from training.config import ConfigError, load_config
from training.data.corpus import DataSourceError
from training.job.check import check_data, check_job, check_locations

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_job_check import data_cfg


@pytest.fixture
def empty(tmp_path) -> list[str]:
    (tmp_path / "empty.jsonl").write_text("")
    return ["--data.source", str(tmp_path / "empty.jsonl"), "--job.out_dir", str(tmp_path / "run")]


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    # in a child with a deadline: opening a FIFO with no writer would block forever
    code = (
        "from training.job.check import check_data; from training.config import load_config; "
        f"check_data(load_config(['--data.source', {str(fifo)!r}]).data, min_samples=1)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is a named pipe (FIFO), not a file of text" in r.stderr
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "dir" / "x.jsonl")  # also inside a directory source
    with pytest.raises(DataSourceError, match="data file .*x.jsonl' is a named pipe"):
        check_data(data_cfg(tmp_path / "dir").data, min_samples=1)


def test_a_read_only_checkpoint_dir_is_refused_as_a_location(tmp_path):
    ckpts = tmp_path / "ro"
    ckpts.mkdir()
    code = (
        "from training.job.check import check_locations; import sys; "
        f"check_locations(out_dir={str(tmp_path)!r}, checkpoint_dir=sys.argv[1], "
        f"metrics_path={str(tmp_path / 'm.jsonl')!r})"
    )
    script = 'mount -t tmpfs -o size=1m,ro tmpfs "$0" && exec "$@"'
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            str(ckpts),
            sys.executable,
            "-c",
            code,
            str(ckpts),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        "ConfigError" in r.stderr
        and f"checkpoint.dir={str(ckpts)!r} is not writable: read-only file system" in r.stderr
    ), r.stderr


# ----------------------------------------------------------------------------------- every start path
def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    e.pop(job_check.DONE_ENV, None)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)


def one_error(r: subprocess.CompletedProcess) -> str:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr, r.stderr
    return errors[0]


def test_make_trains_agent_stops_before_any_worker_with_exit_2(tmp_path, empty):
    r = run("-m", "training.launch.agent", "--standalone", "--nproc_per_node=2", "-m", "training", *TINY, *empty)
    assert r.returncode == 2 and "holds no documents (an empty file)" in one_error(r)
    assert not (tmp_path / "run").exists()  # no worker ran: nothing was created
    r = run(
        "-m",
        "training.launch.agent",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "training",
        "--preset",
        "t5-small",
        "--job.out_dir",
        str(tmp_path / "run"),
    )
    if not torch.cuda.is_available():
        assert r.returncode == 2 and "trains on CUDA GPUs" in one_error(r)


def test_local_multinode_launcher_checks_once(tmp_path, empty):
    r = run("-m", "training.launch", "--nodes", "2", "--nproc-per-node", "1", "--", *TINY, *empty)
    assert r.returncode == 2 and "holds no documents" in one_error(r) and "[node" not in r.stdout


def test_python_m_training_checks_itself(tmp_path, empty):
    r = run("-m", "training", *TINY, *empty)
    assert r.returncode == 2 and "holds no documents" in one_error(r)


def test_slurm_submit_checks_the_shared_files_before_queueing(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "SHARED_DIR", "NODES", "PRESET")}
    env["SLAB_ROOT"] = str(tmp_path / "no-lab")
    r = run(
        "-m",
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--data.source",
        str(tmp_path / "empty.jsonl"),
        env=env,
    )
    assert r.returncode == 2 and "training arguments rejected: data.source=" in one_error(r)
    # EKS: the data is the pods' (on FSx); the submit parses it, the pod's agent checks it
    r = run(
        "-m",
        "tools.k8s.submit",
        "--dry-run",
        "--preset",
        "debug",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--gpus-per-node",
        "0",
        "--efa-per-node",
        "0",
        "--data.source",
        "/fsx/data/corpus.jsonl",
        env=env,
    )
    assert r.returncode == 0 and "/fsx/data/corpus.jsonl" in r.stdout, r.stderr


def test_a_global_batch_the_fixed_world_cannot_split_stops_before_any_worker(tmp_path):
    r = run(
        "-m",
        "training.launch.agent",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "training",
        *TINY,
        "--train.global_batch",
        "7",
        "--job.out_dir",
        str(tmp_path / "run"),
    )
    assert r.returncode == 2 and "train.global_batch=7 is not divisible by the world size 2" in one_error(r)
    assert "exitcode" not in r.stderr and not (tmp_path / "run").exists()  # torchrun never started a worker


def test_locations_on_a_full_file_system_are_refused(tmp_path, tmpfs):
    full = tmpfs("full", "size=64k")
    with open(full / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"x" * 4096)
    for name, kw in (
        ("metrics.path", dict(metrics_path=str(full / "metrics.jsonl"))),
        ("job.out_dir", dict(out_dir=str(full / "run"))),
        ("checkpoint.dir", dict(checkpoint_dir=str(full / "ckpt"))),
    ):
        where = {
            **dict(
                out_dir=str(tmp_path / "run"),
                checkpoint_dir=str(tmp_path / "ckpt"),
                metrics_path=str(tmp_path / "m.jsonl"),
            ),
            **kw,
        }
        with pytest.raises(ConfigError) as e:
            check_locations(**where)
        assert f"{name}=" in str(e.value) and "no space left on the device" in str(e.value), e.value
    assert sorted(p.name for p in full.iterdir()) == ["filler"]  # the probe left nothing behind


def test_an_unusable_memory_dir_is_refused_at_start(tmp_path, tmpfs):
    ok = dict(out_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), metrics_path=str(tmp_path / "m"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="checkpoint.memory_dir='.*afile' is a file, not a directory"):
        check_locations(**ok, memory_dir=str(tmp_path / "afile"))
    ro = tmpfs("ro", "size=64k,ro")
    with pytest.raises(ConfigError, match=r"checkpoint.memory_dir='.*ro' is not writable: read-only file system"):
        check_locations(**ok, memory_dir=str(ro))
    # the whole start path passes it (and only when the tier is on)
    cfg = load_config(
        [
            *TINY,
            "--job.out_dir",
            str(tmp_path / "run"),
            "--checkpoint.memory_dir",
            str(ro),
            "--checkpoint.memory_interval",
            "1",
        ]
    )
    with pytest.raises(ConfigError, match="checkpoint.memory_dir"):
        check_job(cfg, device=False)
    check_job(
        load_config(
            [
                *TINY,
                "--job.out_dir",
                str(tmp_path / "run"),
                "--checkpoint.memory_dir",
                str(ro),
                "--checkpoint.memory_interval",
                "0",
            ]
        ),
        device=False,
    )  # the tier is off: not used

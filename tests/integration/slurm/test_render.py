"""Batch-script renderer and submit CLI: what the script contains, that it is valid bash, bad inputs rejected."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_assets.slurm.render import efa_env, render
from cluster_facts import EFA_LIBRARY_DIRS, platform_timeouts

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.slurm.test_render import BASE

ROOT = Path(__file__).resolve().parents[3]


def sbatch_opts(text: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)", text, flags=re.M)


def bash_syntax_ok(text: str, tmp_path: Path) -> None:
    f = tmp_path / "job.sbatch"
    f.write_text(text)
    out = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_cpu_job_defaults(tmp_path):
    text = render(BASE)
    bash_syntax_ok(text, tmp_path)
    opts = sbatch_opts(text)
    lead = platform_timeouts("slurm").grace_s
    for want in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--requeue",
        f"--signal=B:USR1@{lead}",
        "--open-mode=append",
        "--output=/fsx/runs/r1/slurm-%j.out",
        "--exclusive",
        "--job-name=r1",
    ):
        assert want in opts, (want, opts)
    assert not any(o.startswith(("--gpus", "--time", "--partition")) for o in opts)
    # checkpoints and metrics on shared storage, owned by the job
    assert "CKPT_DIR=/fsx/checkpoints/r1" in text and "METRICS=/fsx/runs/r1/metrics.jsonl" in text
    # one launcher agent per node, killed together, under a timeout, with the launcher's interface
    srun = text[text.index("timeout --kill-after") :]
    assert "srun --kill-on-bad-exit=1" in srun and "--ntasks-per-node=1" in srun
    assert '-m training.launch --from-env slurm --nodes "$NODES" --min-nodes "$NODES"' in text
    assert "trap on_usr1 USR1" in text and 'scontrol requeue "$JOB"' in text
    assert not re.search(r"^export (FI_|NCCL_)", text, flags=re.M)  # nothing to tune for NCCL/EFA on CPU
    assert "--container-image" in text  # pyxis detection is always there; used only with an image
    assert "CONTAINER_IMAGE=''" in text


def test_gpu_instance_types_set_gpus_and_efa(tmp_path):
    p5 = replace(BASE, instance_type="p5.48xlarge", time_limit="12:00:00", partition="gpu")
    text = render(p5)
    bash_syntax_ok(text, tmp_path)
    opts = sbatch_opts(text)
    assert {"--gpus-per-node=8", "--time=12:00:00", "--partition=gpu"} <= set(opts)
    assert "NPROC_PER_NODE=8" in text
    assert "export FI_EFA_USE_HUGE_PAGE=0" in text and "export FI_EFA_USE_DEVICE_RDMA=1" in text
    # the AMI's EFA libraries and NCCL plugin in venv mode, wherever this OS and installer release put them
    assert all(f" {d} " in text or f" {d};" in text for d in EFA_LIBRARY_DIRS)
    g5 = efa_env(replace(BASE, instance_type="g5.48xlarge").with_instance_type())
    assert g5["FI_EFA_USE_HUGE_PAGE"] == "0" and "FI_EFA_USE_DEVICE_RDMA" not in g5  # no GPUDirect RDMA on g5
    assert efa_env(BASE) == {}
    # GPU without EFA: NCCL basics only
    plain = efa_env(replace(BASE, gpus_per_node=4))
    assert not any(k.startswith("FI_") for k in plain) and plain["NCCL_DEBUG"] == "WARN"


def test_container_image_train_args_and_extras_are_quoted(tmp_path):
    cfg = replace(
        BASE,
        container_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/t5-failover:0.1.0",
        train_args=("--train.steps", "200", "--data.source", "/fsx/data/my corpus.jsonl"),
        extra_env=("NCCL_DEBUG=INFO",),
        extra_sbatch=("--account=ml",),
        requeue=False,
    )
    text = render(cfg)
    bash_syntax_ok(text, tmp_path)
    assert "CONTAINER_IMAGE=123456789012.dkr.ecr.us-east-1.amazonaws.com/t5-failover:0.1.0" in text
    assert "CONTAINER_MOUNTS=/fsx:/fsx" in text
    assert "TRAIN_ARGS=(--train.steps 200 --data.source '/fsx/data/my corpus.jsonl')" in text
    assert "export NCCL_DEBUG=INFO" in text
    opts = sbatch_opts(text)
    assert "--account=ml" in opts and "--no-requeue" in opts and "--requeue" not in opts
    # the TRAIN_ARGS array expands back to the exact arguments
    line = next(x for x in text.splitlines() if x.startswith("TRAIN_ARGS="))
    out = subprocess.run(["bash", "-c", line + '; printf "%s\\n" "${TRAIN_ARGS[@]}"'], capture_output=True, text=True)
    assert out.stdout.splitlines() == list(cfg.train_args)


def run_cli(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60
    )


def test_render_cli(tmp_path):
    assert run_cli("cluster_assets.slurm.render", "--help").returncode == 0
    out = tmp_path / "job.sbatch"
    r = run_cli(
        "cluster_assets.slurm.render",
        "--shared-dir",
        "/fsx",
        "--nodes",
        "4",
        "--run-name",
        "x",
        "--output",
        str(out),
        "--",
        "--train.steps",
        "7",
    )
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=4" in out.read_text() and "TRAIN_ARGS=(--train.steps 7)" in out.read_text()
    r = run_cli("cluster_assets.slurm.render", "--shared-dir", "/fsx", "--print-config")
    assert json.loads(r.stdout)["checkpoint_dir"] == "/fsx/checkpoints/debug"
    r = run_cli("cluster_assets.slurm.render", "--shared-dir", "/fsx", "--nodes", "0")
    assert r.returncode == 2 and "error: nodes=0" in r.stderr
    # training flags are checked with the training package's own parser before anything is queued
    r = run_cli("cluster_assets.slurm.render", "--shared-dir", "/fsx", "--", "--train.steps", "-3")
    assert r.returncode == 2 and "train.steps=-3" in r.stderr


def test_node_agent_reports_success_after_a_requested_stop(tmp_path):
    """The per-node wrapper: a stop request (SIGTERM) + non-zero agent exit -> 0; a plain failure passes through."""
    text = render(BASE)
    start = text.index("NODE_AGENT='")
    assign = text[start : text.index('exit "$rc"\'', start) + len('exit "$rc"\'')]
    script = tmp_path / "agent.sh"
    script.write_text(assign + '\nexec bash -c "$NODE_AGENT" t5-node-agent "$@"\n')
    # an "agent" that checkpoints on SIGTERM and exits 143 after a moment (like torchrun + workers)
    agent = ["bash", "-c", "trap 'kill $!; sleep 0.3; exit 143' TERM; sleep 30 & wait"]
    p = subprocess.Popen(["bash", str(script), *agent], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    for pid in [p.pid] + [
        int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    ]:
        os.kill(pid, signal.SIGTERM)  # Slurm signals every process of the step
    _, err = p.communicate(timeout=10)
    assert p.returncode == 0 and "stopped on request (agent exit 143)" in err
    assert subprocess.run(["bash", str(script), "bash", "-c", "exit 3"]).returncode == 3
    r = subprocess.run(["bash", str(script), "/nonexistent/python", "-m", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "is not present on this node" in r.stderr


def submit_env(tmp_path: Path, **extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_CONF", "SHARED_DIR", "NODES", "PRESET", "NPROC", "SPARES", "DRY_RUN")
    }
    env.update(SLAB_ROOT=str(tmp_path / "no-lab"), **extra)
    return env


@pytest.mark.skipif(Path("/fsx").exists(), reason="this host mounts /fsx, the default shared directory")
def test_submit_errors_without_shared_dir_or_slurm(tmp_path):
    r = run_cli("tools.slurm.submit", "--train.steps", "2", env=submit_env(tmp_path))
    assert r.returncode == 3 and "no shared directory" in r.stderr
    r = run_cli("tools.slurm.submit", "--shared-dir", str(tmp_path / "missing"), env=submit_env(tmp_path))
    assert r.returncode == 3 and "does not exist on this host" in r.stderr
    bin_dir = tmp_path / "bin"  # a PATH without Slurm's commands
    bin_dir.mkdir()
    r = run_cli("tools.slurm.submit", "--shared-dir", str(tmp_path), env=submit_env(tmp_path, PATH=str(bin_dir)))
    assert r.returncode == 3 and "sbatch not found" in r.stderr and "make slurm-up" in r.stderr
    r = run_cli(
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--train.steps",
        "3",
        env=submit_env(tmp_path, NODES="4"),
    )
    assert r.returncode == 0 and "#SBATCH --nodes=4" in r.stdout and "TRAIN_ARGS=(--train.steps 3)" in r.stdout


@pytest.mark.parametrize(
    "args, env, line",
    [
        (
            ["--gpus-per-node", "-1"],
            {},
            "error: --gpus-per-node -1: use 0 (CPU) .. 64",
        ),  # the flag typed, not the field
        (["--nproc-per-node=0"], {}, "error: --nproc-per-node 0: use 1..64 processes per node"),
        ([], {"NPROC": "0"}, "error: NPROC='0' is not a whole number >= 1: set it to a count, or unset it"),
        ([], {"NODES": "abc"}, "error: NODES='abc' is not a whole number >= 1"),  # was argparse's usage + "--nodes"
        (["--train.steps", "-1"], {}, "error: training arguments rejected: train.steps=-1 must be > 0"),
    ],
)
def test_submit_names_a_bad_value_as_it_was_given(tmp_path, args, env, line):
    r = run_cli(
        "tools.slurm.submit", "--shared-dir", str(tmp_path), "--dry-run", *args, env=submit_env(tmp_path, **env)
    )
    assert r.returncode == 2 and r.stderr.startswith(line) and r.stderr.count("\n") == 1, r.stderr


def test_slurm_and_eks_submits_reject_the_same_global_batch_with_the_same_words(tmp_path):
    # debug preset: global batch 8; 3 nodes x 1 process cannot split it. Both submitters use
    # cluster_assets/training_args.py, so both refuse it before anything is queued, in the same words.
    slurm = run_cli(
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--nodes",
        "3",
        "--train.global_batch",
        "8",
        env=submit_env(tmp_path),
    )
    eks = run_cli(
        "tools.k8s.submit",
        "--dry-run",
        "--preset",
        "debug",
        "--nodes",
        "3",
        "--nproc-per-node",
        "1",
        "--gpus-per-node",
        "0",
        "--efa-per-node",
        "0",
        "--train.global_batch",
        "8",
        env=submit_env(tmp_path),
    )
    assert slurm.returncode == 2 and eks.returncode == 2, (slurm.stderr, eks.stderr)
    message = (
        "error: training arguments rejected: train.global_batch=8 is not divisible by the world size 3; "
        "pick a global batch that every world size the job may run at divides (e.g. 6) (world size 3 node(s) "
        "x 1 = 3)"
    )
    assert message in slurm.stderr.splitlines() and message in eks.stderr.splitlines()
    # processes per node count: 2 nodes x 4 GPUs = 8 divides 8, 3 x 4 = 12 does not
    ok = run_cli(
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--train.global_batch",
        "8",
        env=submit_env(tmp_path),
    )
    assert ok.returncode == 0, ok.stderr
    bad = run_cli(
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--nodes",
        "3",
        "--gpus-per-node",
        "4",
        "--train.global_batch",
        "8",
        env=submit_env(tmp_path),
    )
    assert bad.returncode == 2 and "world size 3 node(s) x 4 = 12" in bad.stderr


def test_spares_enlarge_the_allocation_and_the_launcher_trains_on_the_others(tmp_path):
    """SPARES=1: sbatch allocates nodes + 1, srun starts an agent on every node, and the launcher's Slurm
    mapping keeps --nnodes at the training nodes (the extra agent waits on torch's redundancy list)."""
    text = render(replace(BASE, nodes=2, spares=1))
    bash_syntax_ok(text, tmp_path)
    assert "--nodes=3" in sbatch_opts(text)
    # a lost node does not end the allocation (the spare takes over inside it); no spare, no --no-kill
    assert "--no-kill" in sbatch_opts(text) and "--no-kill" not in sbatch_opts(render(BASE))
    assert "NODES=2 " in text and "SPARES=1 " in text and "ALLOC_NODES=3" in text
    assert (
        '--spares "$SPARES"' in text
        and 'srun --kill-on-bad-exit=1 $( ((SPARES)) && echo --no-kill) --nodes="$ALLOC_NODES"' in text
    )
    assert "2 node(s) + 1 hot spare(s)" in text  # the summary line
    env = dict(
        os.environ,
        SLURM_JOB_NUM_NODES="3",
        SLURM_JOB_ID="7",
        SLURM_NODEID="2",
        SLURM_JOB_NODELIST="n1",
        SLURM_GPUS_ON_NODE="",
        T5_SPARES="1",
        T5_ETCD_ENDPOINTS="https://10.0.0.2:2379",
    )
    out = subprocess.run(
        [sys.executable, "-m", "training.launch", "--from-env", "slurm", "--print", "--", "--preset", "debug"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "--nnodes=1:2" in out.stdout and "--rdzv-backend=t5-etcd" in out.stdout  # 3 allocated - 1 spare = MAX 2
    store = subprocess.run(
        [sys.executable, "-m", "training.launch", "--from-env", "slurm", "--rdzv-endpoint", "n1:29400", "--print"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert store.returncode == 2 and "hot spare(s) need the etcd coordinator" in store.stderr  # c10d: no spares
    bad = subprocess.run(
        [sys.executable, "-m", "training.launch", "--from-env", "slurm", "--print"],
        capture_output=True,
        text=True,
        env=dict(env, T5_SPARES="3"),
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "T5_SPARES=3 leaves no training node" in bad.stderr


def test_the_store_is_off_the_compute_nodes_by_default(tmp_path):
    """Without etcd, rdzv_store=controller: agents are clients of the controller's store (no --node-hosts-store);
    first-node keeps the old per-job store on the first node. Hot spares only with etcd (the batch host starts as
    the spare, T5_STANDBY=1); a c10d job with spares stops at once, saying why."""
    text = render(replace(BASE, nodes=2, spares=1))
    assert "RDZV_STORE=controller" in text and "RDZV_STORE_PORT=29400" in text
    assert 'RDZV=(--rdzv-endpoint "$STORE_HOST:$RDZV_STORE_PORT")' in text
    assert "((SPARES)) && STANDBY_NODE=0" in text and "export T5_STANDBY=1" in text
    assert "training.launch.standby" not in text  # torch's pickled c10d state is read by nobody
    assert "hot spares need the etcd membership store" in text
    assert "RDZV_STORE=first-node" in render(replace(BASE, rdzv_store="first-node"))
    text = render(replace(BASE, rdzv_store="10.0.1.5", rdzv_store_port=29555))
    assert "RDZV_STORE=10.0.1.5" in text and "RDZV_STORE_PORT=29555" in text
    bash_syntax_ok(text, tmp_path)


def test_a_gpu_preset_is_refused_before_queueing_when_the_nodes_would_run_a_cpu_only_torch(tmp_path):
    # Venv mode (no container image): the nodes run this checkout's venv, whose torch is the CPU wheel. Every rank
    # of a CUDA preset would stop at start (training.job.check), after the queue wait; the submit says so now.
    gpu = (
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--nodes",
        "2",
        "--instance-type",
        "p5.48xlarge",
        "--preset",
        "t5-base",
    )
    r = run_cli(*gpu, env=submit_env(tmp_path))
    assert r.returncode == 2, r.stderr
    assert re.search(
        r"preset 't5-base' trains on CUDA GPUs, but the nodes would run \S+python\S* whose torch "
        r"\S+ is a CPU-only build; build that venv with the CUDA build \(TORCH_BUILD=cu130 "
        r"scripts/venv.sh\) or run the training image \(--container-image\)",
        r.stderr,
    ), r.stderr
    # The same job in the training image, or a CPU preset on the same venv: nothing to refuse.
    image = run_cli(
        *gpu, "--container-image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:src-1", env=submit_env(tmp_path)
    )
    assert image.returncode == 0, image.stderr
    cpu = run_cli(
        "tools.slurm.submit",
        "--shared-dir",
        str(tmp_path),
        "--dry-run",
        "--nodes",
        "2",
        "--preset",
        "debug",
        env=submit_env(tmp_path),
    )
    assert cpu.returncode == 0, cpu.stderr


def test_a_gpu_preset_without_gpus_per_node_is_refused_naming_the_instance_type_option(tmp_path):
    # Without --instance-type the job asks Slurm for no GPUs: one process per node and no GPU to train on.
    image = ("--container-image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5:src-1")
    base = ("tools.slurm.submit", "--shared-dir", str(tmp_path), "--dry-run", "--nodes", "2", "--preset", "t5-base")
    r = run_cli(*base, *image, env=submit_env(tmp_path))
    assert (
        r.returncode == 2
        and (
            "error: preset 't5-base' trains on CUDA GPUs, but the job asks for no GPUs per "
            "node; pass --instance-type with the GPU nodes' instance type"
        )
        in r.stderr
    ), r.stderr
    for gpus in (("--gpus-per-node", "8"), ("--instance-type", "p4d.24xlarge")):
        ok = run_cli(*base, *image, *gpus, env=submit_env(tmp_path))
        assert ok.returncode == 0 and "#SBATCH --gpus-per-node=8" in ok.stdout, ok.stderr


def test_a_job_submitted_to_a_lab_that_runs_etcd_gets_the_labs_etcd(tmp_path):
    """The lab's etcd administration file reaches the batch script without sourcing the lab's env.sh."""
    root = tmp_path / "lab"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "slurm.conf").write_text("ClusterName=lab\n")
    (root / "lab.env").write_text("SLAB_NODES=2\n")
    (root / "etcd").mkdir()
    (root / "etcd" / "admin.env").write_text("T5_ETCD_ENDPOINTS=https://10.0.0.2:2379\n")
    env = submit_env(tmp_path, SLURM_CONF=str(root / "etc" / "slurm.conf"))
    r = run_cli("tools.slurm.submit", "--shared-dir", str(tmp_path), "--dry-run", "--", "--train.steps", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert str(root / "etcd" / "admin.env") in r.stdout
    (root / "etcd" / "admin.env").unlink()  # a lab without etcd: the c10d store path, as before
    r = run_cli("tools.slurm.submit", "--shared-dir", str(tmp_path), "--dry-run", "--", "--train.steps", "2", env=env)
    assert r.returncode == 0 and str(root / "etcd" / "admin.env") not in r.stdout

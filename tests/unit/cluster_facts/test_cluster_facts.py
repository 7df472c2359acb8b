"""cluster_facts: the timeouts of each platform nest and cover a checkpoint of the largest preset, and both
renderers (EKS runtime, Slurm batch script) give the training processes the same NCCL/EFA environment."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from dataclasses import replace

import pytest

from cluster_assets.k8s.runtime import build_cluster_training_runtime, replicated_job
from cluster_assets.k8s.trainjob import TrainJobConfig, train_job_manifest
from cluster_assets.slurm.config import SlurmJobConfig
from cluster_assets.slurm.render import render, sbatch_lines
from cluster_facts import GPU_INSTANCES, SHUTDOWN_MARGIN_S, TIMEOUTS, PlatformTimeouts, nccl_env, platform_timeouts
from stacks.config import InfraConfig
from training.config import PRESET_DIR, ModelConfig, load_config

# --------------------------------------------------------------------------------- checkpoint sizes
#: Bytes of checkpointed state per parameter: FSDP2 keeps the sharded parameters in fp32 (bf16 is only the
#: compute copy of the GPU presets' MixedPrecisionPolicy), plus AdamW's exp_avg and exp_avg_sq in fp32.
STATE_BYTES_PER_PARAM = 4 + 4 + 4
#: Relative-position buckets of T5's attention bias (transformers' T5Config default).
REL_POS_BUCKETS = 32


def t5_params(m: ModelConfig) -> int:
    """Parameters of the gated-GELU T5 the trainer builds (tied embedding and head, no biases)."""
    inner = m.num_heads * m.d_kv
    attention = 4 * m.d_model * inner  # q, k, v, o
    ffn = 3 * m.d_model * m.d_ff  # wi_0, wi_1, wo
    encoder = m.num_layers * (attention + ffn + 2 * m.d_model)  # + 2 layer norms
    decoder = m.num_decoder_layers * (2 * attention + ffn + 3 * m.d_model)  # self + cross attention, 3 norms
    rel_bias = 2 * REL_POS_BUCKETS * m.num_heads  # first block of each stack
    return m.vocab_size * m.d_model + encoder + decoder + rel_bias + 2 * m.d_model  # + final norms


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def state_bytes(preset: str) -> int:
    return t5_params(load_config(["--preset", preset]).model) * STATE_BYTES_PER_PARAM


def largest_preset(platform: str) -> str:
    """``local`` runs on this machine's CPUs, so only the presets that do not ask for CUDA; the clusters run all."""
    names = [p for p in presets() if platform != "local" or load_config(["--preset", p]).parallel.device != "cuda"]
    return max(names, key=state_bytes)


#: Allowance for the training step a SIGTERM waits for before the save (an upper bound, not a measurement):
#: t5-3b has 3.5x the parameters of t5-large, whose step took 0.6 s on one H100 (training/job/trainer.py), and
#: the default job has 16 GPUs; 30 s leaves room for p4d and slow steps. t5-60m on 2 CPU cores: 4.6 s measured.
STEP_ALLOWANCE_S = {"local": 10, "slurm": 30, "eks": 30}


def write_bandwidth_bytes_s(platform: str) -> float:
    """Sustained checkpoint write bandwidth of the whole job on each platform.

    Clusters: the FSx for Lustre file system the stack deploys by default (stacks/config.py defaults:
    1200 GiB at 250 MB/s per TiB = 293 MB/s baseline, MB taken as 10^6 bytes, no burst credit assumed). Every
    node writes its own shards, so with the default 2 nodes each writes half the state at half the
    throughput: the time is state / total throughput whatever the node count.
    Local: 50 MB/s, the slowest figure measured on a 2-core machine (a 728 MB t5-60m async save written in
    ~14 s in the background while training went on).
    """
    if platform == "local":
        return 50e6
    c = InfraConfig()
    return c.fsx_storage_capacity_gib / 1024 * c.fsx_throughput_per_tib * 1e6


def write_time_s(platform: str) -> float:
    return state_bytes(largest_preset(platform)) / write_bandwidth_bytes_s(platform)


def test_the_parameter_formula_is_the_model_the_trainer_builds():
    torch = pytest.importorskip("torch")
    from transformers import T5ForConditionalGeneration

    from training.model.t5 import build_t5_config

    for preset in ("debug", "t5-60m", "t5-3b"):
        m = load_config(["--preset", preset]).model
        with torch.device("meta"):  # shapes only: t5-3b without allocating 11 GB
            model = T5ForConditionalGeneration(build_t5_config(m))
        assert t5_params(m) == sum(p.numel() for p in model.parameters()), preset


def test_the_largest_presets_are_the_ones_the_timeouts_are_sized_for():
    assert largest_preset("eks") == largest_preset("slurm") == "t5-3b"
    assert largest_preset("local") == "t5-60m"
    assert 32e9 < state_bytes("t5-3b") < 33e9  # 2.72 B parameters x 12 bytes
    assert 111 < write_time_s("eks") < 112  # seconds for one full t5-3b checkpoint on the default FSx


# --------------------------------------------------------------------------------- the timeouts table
@pytest.mark.parametrize("platform", sorted(TIMEOUTS))
def test_shutdown_timeout_covers_a_step_and_the_checkpoint_on_sigterm(platform):
    """(a) On SIGTERM a worker finishes its step, waits for a background save still in flight (a full
    write at worst: ``save()`` keeps one save in flight and waits for it first) and then writes the
    synchronous checkpoint: a step plus two full writes of the largest preset the platform runs, at the
    bandwidth of :func:`write_bandwidth_bytes_s`, with the step bounded by :data:`STEP_ALLOWANCE_S`."""
    t = platform_timeouts(platform)
    needed = STEP_ALLOWANCE_S[platform] + 2 * write_time_s(platform)
    assert t.shutdown_timeout_s >= needed, (platform, largest_preset(platform), needed)


@pytest.mark.parametrize("platform", sorted(TIMEOUTS))
def test_the_platform_waits_longer_than_the_agent(platform):
    """(b) Pod grace period (EKS), ``--signal`` lead time (Slurm), a local supervisor's wait: each exceeds the
    agent's shutdown timeout by the margin the agent needs to kill its workers and exit."""
    t = platform_timeouts(platform)
    assert t.grace_s - t.shutdown_timeout_s >= SHUTDOWN_MARGIN_S >= 30
    with pytest.raises(ValueError, match="grace_s"):
        replace(t, grace_s=t.shutdown_timeout_s)


@pytest.mark.parametrize("platform", sorted(TIMEOUTS))
def test_process_group_timeouts_cover_checkpoint_io(platform):
    """The checkpoint group waits for the slowest rank's write (after a save in flight): 4x that worst case,
    so a file system at a quarter of its baseline still completes. The start-up timeout covers each rank
    reading a whole checkpoint back, with the same 4x slack."""
    t = platform_timeouts(platform)
    assert t.checkpoint_pg_timeout_s >= 4 * 2 * write_time_s(platform)
    assert t.init_pg_timeout_s >= 4 * write_time_s(platform)
    assert 10 <= t.train_pg_timeout_s < 600  # hang detection well inside NCCL's own 10-minute watchdog
    assert t.rdzv_join_timeout_s >= 120  # the launcher's measured default on loopback


def test_eks_renderers_read_the_table():
    eks = platform_timeouts("eks")
    rt = build_cluster_training_runtime(
        name="rt", pvc_name="pvc", image="img:1", max_restarts=1, gpus_per_node=8, efa_per_node=32
    )
    job = replicated_job(rt, "node")
    assert job["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == eks.grace_s
    tj = train_job_manifest(TrainJobConfig(name="t", image="img:1", runtime_name="rt", fsx_mount_path="/fsx"))
    command = tj["spec"]["trainer"]["command"]
    for flag, value in (
        ("--shutdown-timeout", eks.shutdown_timeout_s),
        ("--train-timeout-s", eks.train_pg_timeout_s),
        ("--join-timeout", eks.rdzv_join_timeout_s),
    ):
        assert command[command.index(flag) + 1] == str(value), flag


def test_slurm_renderer_reads_the_table():
    slurm = platform_timeouts("slurm")
    cfg = SlurmJobConfig(run_name="r")
    assert f"#SBATCH --signal=B:USR1@{slurm.grace_s}" in sbatch_lines(cfg)
    text = render(cfg)
    for var, value in (
        ("SHUTDOWN_TIMEOUT_S", slurm.shutdown_timeout_s),
        ("TRAIN_TIMEOUT_S", slurm.train_pg_timeout_s),
        ("JOIN_TIMEOUT_S", slurm.rdzv_join_timeout_s),
    ):
        assert re.search(rf"^{var}={value}\b", text, flags=re.M), var
    assert '--train-timeout-s "$TRAIN_TIMEOUT_S" --join-timeout "$JOIN_TIMEOUT_S"' in text


def test_unknown_platform_is_named():
    with pytest.raises(ValueError, match="local, slurm, eks"):
        platform_timeouts("kubernetes")
    assert all(isinstance(t, PlatformTimeouts) for t in TIMEOUTS.values())


# --------------------------------------------------------------------------------- one NCCL/EFA environment
NCCL_KEYS = re.compile(r"^(NCCL_|FI_|TORCH_NCCL_|RDMAV_)")


def runtime_nccl_env(gpus: int, efa: int, rdma: bool) -> dict[str, str]:
    rt = build_cluster_training_runtime(
        name="rt",
        pvc_name="pvc",
        image="img:1",
        max_restarts=1,
        gpus_per_node=gpus,
        efa_per_node=efa,
        gpudirect_rdma=rdma,
    )
    job = replicated_job(rt, "node")
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if NCCL_KEYS.match(e["name"])}


def slurm_nccl_env(cfg: SlurmJobConfig) -> dict[str, str]:
    out = {}
    for line in render(cfg).splitlines():
        m = re.fullmatch(r"export ([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if m and NCCL_KEYS.match(m.group(1)):
            (value,) = shlex.split(m.group(2))
            out[m.group(1)] = value
    return out


@pytest.mark.parametrize("instance_type", sorted(GPU_INSTANCES))
def test_the_efa_environment_is_the_same_on_eks_and_slurm(instance_type):
    """(c) The same instance type gets exactly the same NCCL/EFA variables in the pod and in the batch script."""
    spec = GPU_INSTANCES[instance_type]
    on_eks = runtime_nccl_env(spec.gpus, spec.efa_interfaces, spec.gpudirect_rdma)
    on_slurm = slurm_nccl_env(SlurmJobConfig(run_name="r", instance_type=instance_type))
    assert on_eks == on_slurm == nccl_env(efa=True, gpudirect_rdma=spec.gpudirect_rdma)
    assert ("FI_EFA_USE_DEVICE_RDMA" in on_eks) == spec.gpudirect_rdma


def test_gpu_without_efa_and_cpu_jobs():
    plain = SlurmJobConfig(run_name="r", gpus_per_node=4)
    assert runtime_nccl_env(4, 0, False) == slurm_nccl_env(plain) == nccl_env(efa=False)
    assert not any(k.startswith("FI_") for k in nccl_env(efa=False))
    assert runtime_nccl_env(0, 0, False) == slurm_nccl_env(SlurmJobConfig(run_name="r")) == {}
    with pytest.raises(ValueError, match="needs efa"):
        nccl_env(efa=False, gpudirect_rdma=True)


def test_variables_the_current_efa_stack_sets_itself_are_left_alone():
    env = nccl_env(efa=True, gpudirect_rdma=True)
    for name in ("FI_PROVIDER", "NCCL_PROTO", "FI_EFA_FORK_SAFE", "NCCL_NET_PLUGIN", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert name not in env, name
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"  # data-loader workers fork


# --------------------------------------------------------------------------------- shared names
def test_stack_defaults_are_the_shared_names():
    import cluster_facts as f
    from cluster_assets.parallelcluster.config import build_cluster_config

    c = InfraConfig()
    assert (c.training_namespace, c.runtime_name, c.gpu_instance_type, c.image_tag, c.max_restarts) == (
        f.TRAINING_NAMESPACE,
        f.RUNTIME_NAME,
        f.DEFAULT_GPU_INSTANCE_TYPE,
        f.DEFAULT_IMAGE_TAG,
        f.DEFAULT_MAX_RESTARTS,
    )
    assert SlurmJobConfig().shared_dir == f.FSX_MOUNT_PATH
    pc = build_cluster_config(
        head_node_instance_type="m7i.2xlarge",
        head_node_subnet_id="subnet-0123456789abcdef0",
        compute_subnet_ids=["subnet-0123456789abcdef0"],
        gpu_instance_type="p5.48xlarge",
        compute_resource_name="p5-48xlarge",
        max_nodes=2,
        fsx_file_system_id="fs-0123456789abcdef0",
        additional_security_group_ids=["sg-0123456789abcdef0"],
        bucket_name="b",
    )
    assert pc["Scheduling"]["SlurmQueues"][0]["Name"] == f.GPU_QUEUE
    assert pc["SharedStorage"][0]["MountDir"] == f.FSX_MOUNT_PATH


def test_every_etcd_member_sends_progress_notices_with_a_flag_its_release_accepts():
    from cluster_assets.k8s.etcd import member_args
    from cluster_facts import versions
    from training.launch.rendezvous.client import WATCH_IDLE_S

    assert versions.WATCH_PROGRESS_S * 2 < WATCH_IDLE_S  # a healthy idle watch hears from its member in time

    # the experimental spelling is the one 3.5 (tests) and 3.6 (clusters) both accept; 3.7 removes it
    if versions.WATCH_PROGRESS_FLAG.startswith("--experimental-"):
        for pin in (versions.TEST_ETCD_VERSION, versions.ETCD_VERSION, versions.PCLUSTER_ETCD_VERSION):
            assert tuple(map(int, pin.split(".")[:2])) < (3, 7), (
                f"etcd {pin} has no {versions.WATCH_PROGRESS_FLAG}: use --watch-progress-notify-interval there"
            )
    setting = f"{versions.WATCH_PROGRESS_FLAG}={versions.WATCH_PROGRESS_S}s"
    assert setting in member_args()
    member_sh = (Path(__file__).resolve().parents[3] / "cluster_assets/parallelcluster/etcd/member.sh").read_text()
    assert f"{versions.WATCH_PROGRESS_FLAG} {versions.WATCH_PROGRESS_S}s" in member_sh


def test_every_etcd_member_hashes_passwords_at_the_cost_the_facts_name():
    """The clusters' members run the same --bcrypt-cost as the local ones (cluster_facts.versions.BCRYPT_COST), and
    the one password a cluster generates for itself (ParallelCluster's root) is as random as the jobs' (asserted
    on its template in tests/integration/infra/test_infra_pcluster.py)."""
    from cluster_assets.k8s.etcd import member_args
    from cluster_facts import versions

    assert 4 <= versions.BCRYPT_COST <= 31  # etcd refuses any other
    assert f"--bcrypt-cost={versions.BCRYPT_COST}" in member_args()
    member_sh = (Path(__file__).resolve().parents[3] / "cluster_assets/parallelcluster/etcd/member.sh").read_text()
    assert f"--bcrypt-cost {versions.BCRYPT_COST}" in member_sh

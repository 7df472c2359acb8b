"""training.launch: LaunchConfig -> torchrun argv, and the local / Slurm / Kubeflow PET mappings."""

import sys
from dataclasses import replace

import pytest

from cluster_facts import platform_timeouts

from training.launch import (
    LaunchConfig,
    LaunchError,
    RdzvTuning,
    build_parser,
    config_from_args,
    config_from_env,
    config_from_pet,
    config_from_slurm,
    expand_first_host,
    launch_env,
    preflight,
    rdzv_conf,
    torchrun_argv,
)

SLURM = {
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NODEID": "2",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-09,12]",
    "SLURM_GPUS_ON_NODE": "8",
}
PET = {
    "PET_NNODES": "3",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "t5-run-node-0-0.t5-run",
    "PET_MASTER_PORT": "29500",
}


def flag(argv, name):
    """Value of --name=VALUE in argv (exactly one occurrence)."""
    hits = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(hits) == 1, (name, argv)
    return hits[0]


def test_argv_has_elastic_rendezvous_and_training_module():
    cfg = LaunchConfig(
        min_nodes=1,
        max_nodes=2,
        nproc_per_node=1,
        rdzv_endpoint="127.0.0.1:4000",
        rdzv_id="job7",
        max_restarts=5,
        train_args=("--preset", "debug"),
    )
    argv = torchrun_argv(cfg)
    assert argv[:3] == [sys.executable, "-m", "training.launch.agent"]
    assert flag(argv, "nnodes") == "1:2"
    assert flag(argv, "nproc-per-node") == "1"
    assert flag(argv, "max-restarts") == "5"
    assert flag(argv, "rdzv-backend") == "t5-etcd"  # LaunchConfig's default coordinator, as on every platform
    assert flag(torchrun_argv(replace(cfg, coordinator="store")), "rdzv-backend") == "c10d"
    assert flag(argv, "rdzv-endpoint") == "127.0.0.1:4000"
    assert flag(argv, "rdzv-id") == "job7"
    i = argv.index("--module")
    assert argv[i + 1] == "training"
    local = platform_timeouts("local")
    assert argv[i + 2 :] == [
        "--preset",
        "debug",
        "--parallel.train_timeout_s",
        str(local.train_pg_timeout_s),
        "--parallel.init_timeout_s",
        str(local.init_pg_timeout_s),
        "--checkpoint.timeout_s",
        str(local.checkpoint_pg_timeout_s),
    ]
    assert flag(argv, "shutdown-timeout") == str(local.shutdown_timeout_s)


def test_rdzv_conf_is_tuned_and_external_store_is_a_client():
    conf = dict(kv.split("=") for kv in rdzv_conf(LaunchConfig(coordinator="store")).split(","))
    assert conf == {
        "last_call_timeout": "3",
        "close_timeout": "10",
        "join_timeout": "120",
        "read_timeout": "30",
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "2",
        "is_host": "false",
    }
    assert "is_host" not in rdzv_conf(LaunchConfig())  # etcd (the default): no c10d store to host or not
    hosted = rdzv_conf(
        LaunchConfig(coordinator="store", external_store=False, tuning=RdzvTuning(keep_alive_max_attempt=3))
    )
    assert "is_host" not in hosted and "keep_alive_max_attempt=3" in hosted


def test_env_disables_shared_rendezvous_store():
    env = launch_env(LaunchConfig(node_rank=3), base={"PATH": "/bin"})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["T5_NODE_RANK"] == "3" and env["PATH"] == "/bin"
    assert env["TORCH_ELASTIC_WORKER_IDENTICAL"] == "1"  # a fixed --nproc-per-node: ranks without a gather
    assert "TORCH_ELASTIC_WORKER_IDENTICAL" not in launch_env(LaunchConfig(nproc_per_node="gpu"), base={})


def test_explicit_train_timeout_is_not_overridden():
    argv = torchrun_argv(LaunchConfig(train_args=("--parallel.train_timeout_s", "7")))
    assert argv.count("--parallel.train_timeout_s") == 1 and argv[argv.index("--parallel.train_timeout_s") + 1] == "7"
    assert "--parallel.train_timeout_s" not in torchrun_argv(LaunchConfig(train_timeout_s=0))
    argv = torchrun_argv(LaunchConfig(train_args=("--checkpoint.timeout_s=99",)))
    assert "--checkpoint.timeout_s" not in argv and "--checkpoint.timeout_s=99" in argv


@pytest.mark.parametrize(
    "bad, needle",
    [
        (dict(min_nodes=0), "min nodes 0"),
        (dict(min_nodes=3, max_nodes=2), "max nodes 2 < min nodes 3"),
        (dict(rdzv_endpoint="nohost"), "not HOST:PORT"),
        (dict(rdzv_id="a b"), "rendezvous id"),
        (dict(nproc_per_node="many"), "--nproc-per-node 'many'"),
        (dict(max_restarts=-1), "--max-restarts -1"),
        (dict(tuning=RdzvTuning(join_timeout=0)), "--join-timeout 0"),
        (dict(tuning=RdzvTuning(keep_alive_interval=0, keep_alive_max_attempt=0)), "--keep-alive 0x0"),
        (dict(tuning=RdzvTuning(keep_alive_max_attempt=0)), "--keep-alive 1x0"),
        (
            dict(coordinator="etcd", tuning=RdzvTuning(keep_alive_max_attempt=1)),
            "--keep-alive 1x1: etcd's shortest lease is 2 s",
        ),
        (dict(coordinator="etcd", max_nodes=8001), "max nodes 8001: a round on etcd holds at most 8,000 nodes"),
    ],
)
def test_bad_values_are_named(bad, needle):
    with pytest.raises(LaunchError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        torchrun_argv(LaunchConfig(**bad))


def test_join_timeout_and_keep_alive_flags_both_reach_rdzv_conf():
    a = build_parser().parse_args(["--join-timeout", "600", "--keep-alive", "2x5", "--", "--preset", "debug"])
    conf = dict(kv.split("=") for kv in rdzv_conf(config_from_args(a, env={})).split(","))
    assert (conf["join_timeout"], conf["keep_alive_interval"], conf["keep_alive_max_attempt"]) == ("600", "2", "5")


def test_slurm_requeue_gets_a_fresh_rendezvous_and_external_store_wins():
    env = dict(SLURM, SLURM_RESTART_COUNT="2", T5_RDZV_ENDPOINT="head:29999", T5_MIN_NODES="3")
    cfg = config_from_slurm(env, first_host=expand_first_host)
    assert cfg.rdzv_id == "slurm-4242-r2"
    assert cfg.rdzv_endpoint == "head:29999" and cfg.external_store
    assert flag(torchrun_argv(cfg), "nnodes") == "3:4"


def test_each_mapping_sets_the_coordinator_itself():
    """etcd where the platform gives it (T5_ETCD_ENDPOINTS) or locally; without it the clusters fall back to torch's
    c10d on a store, whatever LaunchConfig's default is."""
    etcd = {"T5_ETCD_ENDPOINTS": "https://10.0.0.2:2379"}
    slurm = dict(SLURM, T5_RDZV_ENDPOINT="head:29999")  # no scontrol needed
    assert config_from_slurm(slurm, first_host=expand_first_host).coordinator == "store"
    assert config_from_slurm({**slurm, **etcd}, first_host=expand_first_host).coordinator == "etcd"
    assert config_from_pet(PET).coordinator == "store"
    assert config_from_pet({**PET, **etcd}).coordinator == "etcd"
    assert config_from_env("local", {}).coordinator == "etcd"
    assert config_from_env("local", {"T5_COORDINATOR": "store"}).coordinator == "store"
    assert config_from_env("local", {"T5_RDZV_ENDPOINT": "127.0.0.1:1"}).coordinator == "store"
    assert config_from_env("local", {"T5_COORDINATOR": "store", **etcd}).coordinator == "etcd"


def test_slurm_missing_variable_says_which():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}
    with pytest.raises(LaunchError, match="SLURM_JOB_ID is not set"):
        config_from_slurm(env, first_host=expand_first_host)


@pytest.mark.parametrize(
    "nodelist, first", [("n1", "n1"), ("node[03-05,9],gpu1", "node03"), ("a-b[10-11]-x", "a-b10-x"), ("c1,c2", "c1")]
)
def test_hostlist_fallback_expansion(nodelist, first):
    assert expand_first_host(nodelist) == first


def test_pet_mapping_matches_kubeflow_trainer_torch_plugin():
    cfg = config_from_pet(PET)
    assert (cfg.max_nodes, cfg.min_nodes, cfg.nproc_per_node, cfg.node_rank) == (3, 1, 8, 1)
    assert cfg.rdzv_endpoint == "t5-run-node-0-0.t5-run:29500" and not cfg.external_store
    assert cfg.rdzv_id == "trainjob-t5-run"
    cfg = config_from_pet(dict(PET, PET_NNODES="2:3", PET_NPROC_PER_NODE="auto"))
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node) == (2, 3, "auto")


def test_pet_hot_spares_are_pods_beyond_max():
    cfg = config_from_pet(dict(PET, PET_NNODES="3", T5_SPARES="1", T5_MIN_NODES="2"))
    assert (cfg.min_nodes, cfg.max_nodes, cfg.spares) == (2, 2, 1)
    with pytest.raises(LaunchError, match="T5_SPARES=3 leaves no training pod of the TrainJob's 3"):
        config_from_pet(dict(PET, PET_NNODES="3", T5_SPARES="3"))


def test_pet_missing_variable_says_which():
    with pytest.raises(LaunchError, match="PET_MASTER_ADDR is not set"):
        config_from_pet({k: v for k, v in PET.items() if k != "PET_MASTER_ADDR"})


def test_local_and_cluster_share_the_same_argv_shape():
    """Apart from sizes, timeouts (each platform's row), endpoint and id, a local agent runs exactly what a
    Slurm/PET node runs."""
    import re

    def shape(argv):
        return [a.split("=", 1)[0] if a.startswith("--") else "N" if a.isdigit() else a for a in argv]

    p = build_parser()
    # the clusters run the c10d store until they run etcd (the coordinator on AWS): compare like with like
    local = config_from_args(p.parse_args(["--nodes", "2", "--", "--preset", "debug"]), env={"T5_COORDINATOR": "store"})
    pet = config_from_args(
        p.parse_args(["--from-env", "pet", "--rdzv-endpoint", "store:1", "--", "--preset", "debug"]), env=PET
    )
    assert shape(torchrun_argv(local)) == shape(torchrun_argv(pet))
    # both against an external store (is_host=false), same tuning keys
    assert re.sub(r"\d+", "N", rdzv_conf(local)) == re.sub(r"\d+", "N", rdzv_conf(pet))


def test_preflight_rejects_bad_training_args_before_any_agent_starts():
    with pytest.raises(LaunchError, match="train.global_batch"):
        preflight(LaunchConfig(train_args=("--train.global_batch", "0")))
    with pytest.raises(LaunchError, match="divides by none"):
        preflight(LaunchConfig(min_nodes=3, max_nodes=3, train_args=("--train.global_batch", "8")))
    warn = preflight(LaunchConfig(min_nodes=1, max_nodes=3, train_args=("--train.global_batch", "8")))
    assert warn and "[3]" in warn[0]

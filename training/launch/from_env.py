"""Platform environment -> :class:`LaunchConfig`: local simulated nodes, Slurm, Kubeflow Trainer (``PET_*``).

Each mapping reads only the variables its platform sets, plus the overrides every mapping honours
(T5_RDZV_ENDPOINT, T5_RDZV_ID, T5_MIN_NODES, T5_SPARES); a missing variable raises :class:`LaunchError` naming it.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from cluster_facts import platform_timeouts
from training.launch.config import DEFAULT_RDZV_PORT, LaunchConfig, LaunchError, with_platform_timeouts
from training.launch.hostlist import slurm_first_host


def _int_env(env: Mapping[str, str], name: str, hint: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        raise LaunchError(f"{name} is not set: {hint}")
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r} is not an integer: {hint}") from None


def _nnodes(raw: str, name: str) -> tuple[int | None, int]:
    """Parse ``N`` or ``MIN:MAX``; returns (min or None, max)."""
    try:
        if ":" in raw:
            lo, hi = raw.split(":", 1)
            return int(lo), int(hi)
        return None, int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r}: expected N or MIN:MAX") from None


def _common(env: Mapping[str, str], default_endpoint: str, default_id: str, without_etcd: str = "store") -> dict:
    """Overrides every mapping honours: an external store, an explicit id, the MIN of --nnodes; and the
    coordinator: etcd when the platform gives its endpoints (``T5_ETCD_ENDPOINTS``), else ``without_etcd``
    (the clusters': torch's c10d on a store; never left to :class:`LaunchConfig`'s default)."""
    ext = env.get("T5_RDZV_ENDPOINT", "")
    out: dict = {
        "rdzv_endpoint": ext or default_endpoint,
        "external_store": bool(ext),
        "rdzv_id": env.get("T5_RDZV_ID") or default_id,
        # an etcd cluster the platform runs; its T5_ETCD_* reach the agents as they are
        "coordinator": "etcd" if env.get("T5_ETCD_ENDPOINTS") else without_etcd,
    }
    if env.get("T5_MIN_NODES"):
        out["min_nodes"] = _int_env(env, "T5_MIN_NODES", "set it to the fewest nodes to keep training with")
    if env.get("T5_SPARES"):
        out["spares"] = _int_env(env, "T5_SPARES", "set it to the number of hot-spare nodes (0 = none)")
    return out


def config_from_slurm(env: Mapping[str, str], first_host: Callable[[str], str] = slurm_first_host) -> LaunchConfig:
    """Map a Slurm allocation (one launcher per node, e.g. ``srun --ntasks-per-node=1``) to a LaunchConfig.

    The rendezvous id includes SLURM_RESTART_COUNT so a requeued job starts a fresh rendezvous.
    Without T5_ETCD_ENDPOINTS (etcd) or T5_RDZV_ENDPOINT the first allocated host serves a c10d store. With
    T5_SPARES=K the allocation holds K hot spares: the job trains on ``SLURM_JOB_NUM_NODES - K`` nodes
    (``--nnodes MIN:MAX`` with that MAX) and the K others wait in the rendezvous for a lost node's place.
    """
    hint = "run inside an sbatch/salloc allocation (srun --ntasks-per-node=1 python -m training.launch ...)"
    nnodes = _int_env(env, "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES", hint)
    job = _int_env(env, "SLURM_JOB_ID", hint)
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError(f"SLURM_JOB_NODELIST is not set: {hint}")
    node_rank = _int_env(env, "SLURM_NODEID", hint)
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    common = _common(
        env,
        f"{first_host(nodelist)}:{env.get('T5_RDZV_PORT', DEFAULT_RDZV_PORT)}",
        f"slurm-{job}" + (f"-r{restart}" if restart else ""),
    )
    spares = common.get("spares", 0)
    if spares >= nnodes:
        raise LaunchError(
            f"T5_SPARES={spares} leaves no training node in this {nnodes}-node allocation: "
            f"allocate spares + training nodes (sbatch --nodes), or lower T5_SPARES"
        )
    cfg = LaunchConfig(
        max_nodes=nnodes - spares,
        nproc_per_node=int(gpus) if gpus.isdigit() and int(gpus) > 0 else 1,
        node_rank=node_rank,
        **common,
    )
    return with_platform_timeouts(cfg, platform_timeouts("slurm"))


def config_from_pet(env: Mapping[str, str]) -> LaunchConfig:
    """Map the Kubeflow Trainer v2.3 torch plugin's ``PET_*`` variables (container ``node``) to a LaunchConfig.

    PET_MASTER_ADDR is ``<job>-node-0-0.<job>``: the part after the first dot (the TrainJob name) is the
    rendezvous id unless T5_RDZV_ID is set. Without T5_ETCD_ENDPOINTS (etcd, which the runtime gives) or
    T5_RDZV_ENDPOINT node 0 serves a c10d store. With
    T5_SPARES=K, K of the PET_NNODES pods are hot spares: the job trains on PET_NNODES - K (MAX).
    """
    hint = "this mapping runs inside a Kubeflow TrainJob pod (torch runtime, container 'node')"
    raw = env.get("PET_NNODES")
    if not raw:
        raise LaunchError(f"PET_NNODES is not set: {hint}")
    lo, hi = _nnodes(raw, "PET_NNODES")
    nproc = _nproc_env(env, "PET_NPROC_PER_NODE", "1")
    node_rank = _int_env(env, "PET_NODE_RANK", hint)
    addr = env.get("PET_MASTER_ADDR")
    if not addr:
        raise LaunchError(f"PET_MASTER_ADDR is not set: {hint}")
    port = _int_env(env, "PET_MASTER_PORT", hint)
    job = addr.split(".", 1)[1].split(".", 1)[0] if "." in addr else addr
    common = _common(env, f"{addr}:{port}", f"trainjob-{job}")
    spares = common.get("spares", 0)
    if spares >= hi:
        raise LaunchError(
            f"T5_SPARES={spares} leaves no training pod of the TrainJob's {hi} (numNodes counts "
            f"the spares): lower T5_SPARES or raise numNodes"
        )
    common.setdefault("min_nodes", lo if lo is not None else 1)
    cfg = LaunchConfig(max_nodes=hi - spares, nproc_per_node=nproc, node_rank=node_rank, **common)
    return with_platform_timeouts(cfg, platform_timeouts("eks"))


def _nproc_env(env: Mapping[str, str], name: str, default: str) -> int | str:
    """Workers per node from ``name``: a whole number, or torchrun's gpu/cpu/auto; anything else raises
    :class:`LaunchError` naming the variable (not the flag it becomes)."""
    raw = env.get(name) or default
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    if raw in ("gpu", "cpu", "auto"):
        return raw
    raise LaunchError(
        f"{name}={raw!r} is not a number of workers per node: set it to 1 or more (or gpu, cpu, auto), or unset it"
    )


def config_from_local(env: Mapping[str, str]) -> LaunchConfig:
    """Local simulated nodes: NODES, NPROC and SPARES (Makefile variables); membership in a 3-member etcd
    started by :func:`training.launch.local.run_local` (``T5_COORDINATOR=store``: torch's c10d on a standalone
    store instead)."""
    hint = "set it to the number of simulated nodes (1 or more), or unset it"
    nodes = _int_env(env, "NODES", hint) if env.get("NODES") else 2
    if nodes < 1:
        raise LaunchError(f"NODES={nodes} is not a number of nodes: {hint}")
    common = _common(
        env,
        f"127.0.0.1:{DEFAULT_RDZV_PORT}",
        "t5-local",
        without_etcd=env.get("T5_COORDINATOR") or ("store" if env.get("T5_RDZV_ENDPOINT") else "etcd"),
    )
    common["external_store"] = True  # local runs never host the store in an agent (run_local starts it)
    if env.get("SPARES") and "spares" not in common:
        common["spares"] = _int_env(env, "SPARES", "set it to the number of hot-spare nodes (0 = none)")
    return LaunchConfig(max_nodes=nodes, nproc_per_node=_nproc_env(env, "NPROC", "1"), **common)


def config_from_env(kind: str, env: Mapping[str, str] | None = None) -> LaunchConfig:
    """``local`` | ``slurm`` | ``pet`` -> LaunchConfig (flags are applied on top by the CLI)."""
    env = os.environ if env is None else env
    if kind == "local":
        return config_from_local(env)
    if kind == "slurm":
        return config_from_slurm(env)
    if kind == "pet":
        return config_from_pet(env)
    raise LaunchError(f"--from-env {kind!r}: use local, slurm or pet")

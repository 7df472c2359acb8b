"""Command lines and environment derived from a :class:`LaunchConfig` (pure functions, nothing runs here).

Local runs, Slurm and Kubeflow all start agents with :func:`torchrun_argv` and :func:`launch_env`, so the
local multi-node run exercises exactly the torchrun arguments the clusters use.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Sequence

from training.launch.config import IDENTICAL_WORKERS_ENV, RDZV_ENV, LaunchConfig


def rdzv_conf(cfg: LaunchConfig) -> str:
    """The ``--rdzv-conf`` value: tuned timeouts, keep-alive, and ``is_host=false`` for an external store."""
    t = cfg.tuning
    parts = [
        f"last_call_timeout={t.last_call_timeout}",
        f"close_timeout={t.close_timeout}",
        f"join_timeout={t.join_timeout}",
        f"read_timeout={t.read_timeout}",
        f"keep_alive_interval={t.keep_alive_interval}",
        f"keep_alive_max_attempt={t.keep_alive_max_attempt}",
    ]
    if cfg.external_store and cfg.coordinator == "store":
        parts.append("is_host=false")
    return ",".join(parts)


def training_argv(cfg: LaunchConfig) -> list[str]:
    """The training module's arguments, plus the platform's process-group timeouts the args do not set."""
    args = list(cfg.train_args)
    for flag, value in (
        ("--parallel.train_timeout_s", cfg.train_timeout_s),
        ("--parallel.init_timeout_s", cfg.init_timeout_s),
        ("--checkpoint.timeout_s", cfg.checkpoint_timeout_s),
    ):
        given = any(a == flag or a.startswith(flag + "=") for a in args)
        if value and not given:
            args += [flag, str(value)]
    return args


def torchrun_argv(cfg: LaunchConfig) -> list[str]:
    """One agent's full command line (pure: depends only on ``cfg``).

    The agent is torchrun's own (``torch.distributed.run``, same arguments) run through
    :mod:`training.launch.agent`, which adds the clean stop on Ctrl-C and the one-line exit.
    """
    cfg.validate()
    return [
        cfg.python,
        "-m",
        "training.launch.agent",
        f"--nnodes={cfg.min_nodes}:{cfg.max_nodes}",
        f"--nproc-per-node={cfg.nproc_per_node}",
        f"--max-restarts={cfg.max_restarts}",
        f"--rdzv-backend={'t5-etcd' if cfg.coordinator == 'etcd' else 'c10d'}",
        f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        f"--rdzv-id={cfg.rdzv_id}",
        f"--rdzv-conf={rdzv_conf(cfg)}",
        f"--shutdown-timeout={cfg.shutdown_timeout_s}",
        "--module",
        cfg.module,
        *training_argv(cfg),
    ]


def launch_env(cfg: LaunchConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for an agent: ``base`` (default os.environ) plus the rendezvous workaround, and torchrun's
    rank assignment without a gather when every node runs a fixed number of workers."""
    env = dict(os.environ if base is None else base)
    env.update(RDZV_ENV)
    if isinstance(cfg.nproc_per_node, int):  # "gpu"/"auto": nodes may differ, torchrun gathers their counts
        env.update(IDENTICAL_WORKERS_ENV)
    env.update(dict(cfg.etcd_env))
    env.setdefault("PYTHONUNBUFFERED", "1")  # timely logs: the chaos harness timestamps lines as they come
    if cfg.node_rank is not None:
        env["T5_NODE_RANK"] = str(cfg.node_rank)
    return env


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of an agent's environment (:func:`launch_env`) a printed command line carries: the variables that
    change torchrun's behaviour (never the etcd credentials' variables)."""
    return {k: env[k] for k in (*RDZV_ENV, *IDENTICAL_WORKERS_ENV) if k in env}


def store_argv(port: int, port_file: str | None = None, python: str = sys.executable) -> list[str]:
    """Command line of the standalone rendezvous store (``training.rdzv_store``)."""
    argv = [python, "-m", "training.rdzv_store", "--port", str(port)]
    if port_file:
        argv += ["--port-file", port_file]
    return argv


def format_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Shell-quoted command line, prefixed with the rendezvous env vars it needs."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)

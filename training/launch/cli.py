"""Elastic launcher: one torchrun command line for this machine, Slurm and Kubeflow Trainer.

Every platform goes through the same typed :class:`LaunchConfig` and the same :func:`torchrun_argv`, so the
local multi-node run exercises exactly the torchrun arguments the clusters use:

* ``--nnodes=MIN:MAX`` elastic membership, ``--max-restarts`` for worker failures;
* membership on etcd (``--rdzv-backend=t5-etcd``, :mod:`training.launch.rendezvous`): 3 members off the
  training nodes, each agent's lease with a fast keep-alive (TTL 1 s x 2), so a lost node is noticed in about
  2 s instead of ~50 s; tuned round timeouts (``--rdzv-conf``);
* each round's store (rank assignment, exit barrier) is served by that round's rank-0 agent, so no process
  outside the round can end the job: losing *any* node, rank 0's included, ends only the round;
* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the workers get a store of their own, not the round's (works
  around a torch 2.13 deadlock when a node joins a later rendezvous round, pytorch#147064);
* ``TORCH_ELASTIC_WORKER_IDENTICAL=1`` with a fixed ``--nproc-per-node``: workers' ranks from the node's
  rendezvous rank, no gather through rank 0's store (a node lost after its round formed is a lost node, not a
  30 s store timeout that fails every agent);
* a short process-group timeout after the first step (``--parallel.train_timeout_s``) so a hung peer is
  detected in seconds, not the 10-30 minute defaults.

Without etcd (``T5_COORDINATOR=store``, ``--rdzv-endpoint``, or a cluster that gives no ``T5_ETCD_*``) the
agents fall back to torch's own c10d rendezvous, as torch ships it (no hot spares there), on a standalone store
(``is_host=false`` against ``python -m training.rdzv_store``; on Slurm the first node's when the head node's
store does not answer).

Usage::

    python -m training.launch [--from-env local|slurm|pet] [options] [-- TRAINING ARGS]
    python -m training.launch --nodes 2 -- --preset debug --train.steps 20      # 2 simulated nodes here
    python -m training.launch --from-env slurm --print -- --preset t5-base       # show, don't run
    srun --ntasks-per-node=1 python -m training.launch --from-env slurm -- --preset t5-base
    # Kubeflow Trainer container `node`:  python -m training.launch --from-env pet -- --preset t5-base

Environment read by the mappings (flags win over environment):

* local: NODES (default 2), NPROC (default 1), SPARES (default 0); starts a 3-member etcd on loopback for the
  membership (TLS, the job's own etcd user), or with T5_COORDINATOR=store or --rdzv-endpoint torch's c10d
  rendezvous on a standalone store.
* slurm: SLURM_JOB_NUM_NODES, SLURM_NODEID, SLURM_JOB_ID, SLURM_RESTART_COUNT, SLURM_JOB_NODELIST
  (first host via ``scontrol show hostnames``), SLURM_GPUS_ON_NODE.
* pet (Kubeflow Trainer v2 torch plugin): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT.
* all: T5_ETCD_ENDPOINTS and the other T5_ETCD_* (the cluster's etcd and the job's credentials: the etcd
  coordinator; on Slurm and EKS without them, the c10d fallback), T5_RDZV_ENDPOINT (HOST:PORT of a standalone
  store -> c10d, is_host=false), T5_RDZV_ID, T5_MIN_NODES, T5_SPARES (Slurm: that many nodes of the allocation
  are hot spares; it trains on the others).

Hot spares (``--spares K``, etcd only): K more agents with the same command line join the rendezvous; beyond
MAX nodes they stay members without a seat, and when a node is lost the next round gives its rank to a spare,
so the world size stays the same and the job resumes bitwise as if nothing happened (the lost node's shards come
from their replica in the in-memory tier). Whichever agents join first train; the others are the spares.

Stopping: Ctrl-C or SIGTERM makes the workers checkpoint at the next step and exit (a second Ctrl-C stops
everything at once, without the checkpoint); if a local launcher dies, even by SIGKILL, its agents, etcd members
and store get SIGTERM; workers always die with their agent. Each agent is torchrun's, run as
``python -m training.launch.agent``.

Exit codes: 0 finished, 2 bad settings, 7 checkpoint.dir in use by another run (local: checked before any agent
starts), 128+signum after a stop (130 Ctrl-C, 143 SIGTERM: rerun to resume), otherwise the first failed
agent's code.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Callable, Mapping, NoReturn

from training.job.check import DONE_ENV
from training.launch.commands import format_argv, launch_env, shown_env, store_argv, torchrun_argv, training_argv
from training.launch.config import DEFAULT_RDZV_PORT, LaunchConfig, LaunchError
from training.launch.from_env import config_from_env
from training.launch.local import run_local
from training.launch.preflight import check_checkpoint_dir, check_module, check_training_job, preflight
from training.checkpoint.run_lock import EXIT_BUSY, CheckpointDirBusy


HELP_POINTER = "python -m training.launch --help lists the options"


class _Parser(argparse.ArgumentParser):
    """A bad flag ends the launcher with one line naming it and the fix, exit 2: argparse's own error printed the
    13-line usage first, which pushed the one useful line off a small terminal."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({HELP_POINTER})\n")


def _whole(flag: str, example: int) -> Callable[[str], int]:
    """argparse type for an integer flag whose error names the value and an example (not 'invalid int value')."""

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            msg = f"{text!r} is not a whole number: pass one, e.g. {flag} {example}"
            raise argparse.ArgumentTypeError(msg) from None

    parse.__name__ = "int"
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags; this module's docstring is the ``--help`` text (usage and environment as epilog)."""
    doc = __doc__.split("\n\n")
    p = _Parser(
        prog="python -m training.launch",
        description=doc[0] + "\n\n" + doc[1],
        epilog="\n\n".join(doc[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from-env",
        choices=["local", "slurm", "pet"],
        default="local",
        help="where node count/rank/endpoint come from (default local: simulated nodes here)",
    )
    p.add_argument(
        "--nodes", type=_whole("--nodes", 2), help="MAX nodes (local: how many agents to start; default NODES or 2)"
    )
    p.add_argument(
        "--spares",
        type=_whole("--spares", 1),
        help="hot-spare nodes beyond --nodes, waiting to replace a lost node (default SPARES or 0)",
    )
    p.add_argument(
        "--min-nodes", type=_whole("--min-nodes", 1), help="MIN nodes to keep training with (default 1 or T5_MIN_NODES)"
    )
    p.add_argument("--nproc-per-node", help="workers per node (int|gpu|cpu|auto)")
    p.add_argument(
        "--max-restarts", type=_whole("--max-restarts", 3), help="worker-group restarts before failing (default 3)"
    )
    p.add_argument(
        "--rdzv-endpoint",
        help="HOST:PORT of a standalone store: torch's c10d rendezvous instead of etcd (implies is_host=false)",
    )
    p.add_argument("--rdzv-id", help="rendezvous id (default derived from the platform)")
    p.add_argument(
        "--node-hosts-store",
        action="store_true",
        help="with --rdzv-endpoint: the agent on that host serves the store (plain c10d)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_whole("--shutdown-timeout", 60),
        help="seconds between SIGTERM and SIGKILL of workers (default: the platform's, cluster_facts.TIMEOUTS)",
    )
    p.add_argument(
        "--train-timeout-s",
        type=_whole("--train-timeout-s", 60),
        help="process-group timeout after step 1, for hang detection (default: the platform's; 0 = training's)",
    )
    p.add_argument(
        "--join-timeout",
        type=_whole("--join-timeout", 120),
        metavar="SECONDS",
        help="how long a rendezvous round waits for MIN nodes, e.g. a replacement node's boot "
        "and image pull (default 120)",
    )
    p.add_argument(
        "--keep-alive",
        metavar="INTERVALxATTEMPTS",
        help="rendezvous heartbeat, e.g. 1x3 (node-loss detection = product: on etcd the membership "
        "lease's TTL, 2 s at least; default 1x2)",
    )
    p.add_argument(
        "--module",
        default="training",
        help="module the workers run (default training; found here before anything starts)",
    )
    p.add_argument("--print", dest="print_only", action="store_true", help="print the command(s), run nothing")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the training module's arguments")
    return p


def config_from_args(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> LaunchConfig:
    """Platform mapping first, then explicit flags on top."""
    cfg = config_from_env(a.from_env, env)
    over: dict = {"module": a.module}
    if a.nodes is not None:
        if a.nodes < 1:  # named here: the generic min/max check would blame --min-nodes
            raise LaunchError(f"--nodes {a.nodes}: use 1 or more nodes")
        over["max_nodes"] = a.nodes
    if a.min_nodes is not None:
        over["min_nodes"] = a.min_nodes
    if a.spares is not None:
        over["spares"] = a.spares
    if a.nproc_per_node is not None:
        over["nproc_per_node"] = int(a.nproc_per_node) if a.nproc_per_node.isdigit() else a.nproc_per_node
    if a.max_restarts is not None:
        over["max_restarts"] = a.max_restarts
    if a.rdzv_endpoint:
        over["rdzv_endpoint"] = a.rdzv_endpoint
        over["external_store"] = not a.node_hosts_store
        over["coordinator"] = "store"  # an endpoint is a c10d store's
    if a.rdzv_id:
        over["rdzv_id"] = a.rdzv_id
    if a.shutdown_timeout is not None:
        over["shutdown_timeout_s"] = a.shutdown_timeout
    if a.train_timeout_s is not None:
        over["train_timeout_s"] = a.train_timeout_s
    if a.join_timeout is not None:
        over["tuning"] = replace(cfg.tuning, join_timeout=a.join_timeout)
    if a.keep_alive:
        try:
            iv, att = (int(x) for x in a.keep_alive.lower().split("x"))
        except ValueError:
            raise LaunchError(f"--keep-alive {a.keep_alive!r}: expected INTERVALxATTEMPTS, e.g. 1x2") from None
        over["tuning"] = replace(over.get("tuning", cfg.tuning), keep_alive_interval=iv, keep_alive_max_attempt=att)
    targs = list(a.train_args)
    if targs and targs[0] == "--":
        targs = targs[1:]
    over["train_args"] = tuple(targs)
    cfg = replace(cfg, **over)
    if cfg.min_nodes > cfg.max_nodes:  # e.g. T5_MIN_NODES=2 with --nodes 1: say which values clash
        raise LaunchError(f"min nodes {cfg.min_nodes} > max nodes {cfg.max_nodes}: lower --min-nodes/T5_MIN_NODES")
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; returns the exit code (see the module docstring). On Slurm/Kubeflow the agent replaces
    this process."""
    parser = build_parser()
    a, unknown = parser.parse_known_args(argv)
    if unknown:  # the line says the fix itself: no pointer to --help
        print(
            f"error: unknown launcher option(s) {' '.join(unknown)}: training arguments go after '--' "
            f"(python -m training.launch [options] -- --preset debug ...)",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = config_from_args(a)
        for w in preflight(cfg):
            print(f"[launch] warning: {w}", file=sys.stderr)
        if not a.print_only:  # --print only shows the command, maybe for a host or image where the module is
            check_module(cfg.module)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.from_env == "local":
        nodes = cfg.max_nodes
        own_store = not (a.rdzv_endpoint or os.environ.get("T5_RDZV_ENDPOINT"))
        if a.print_only:
            if cfg.coordinator == "etcd":
                print(
                    "# membership: 3 etcd members on loopback (TLS, client certificates, this job's etcd user), "
                    "their T5_ETCD_* variables given to each agent"
                )
            elif own_store:
                print("# standalone rendezvous store (no training node hosts it):")
                print(format_argv(store_argv(DEFAULT_RDZV_PORT, python=cfg.python)))
            print(
                f"# one agent per simulated node, {nodes} node(s)"
                + (f" + {cfg.spares} hot spare(s) (the first {nodes} to join train)" if cfg.spares else "")
                + ":"
            )
            for i in range(nodes + cfg.spares):
                print(format_argv(torchrun_argv(cfg), shown_env(launch_env(cfg, base={})) | {"T5_NODE_RANK": str(i)}))
            return 0
        try:
            check_checkpoint_dir(cfg)
        except CheckpointDirBusy as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BUSY
        if cfg.module == "training":  # once here, not once per simulated node (their agents skip it)
            code = check_training_job(
                training_argv(cfg), nproc_per_node=cfg.nproc_per_node if isinstance(cfg.nproc_per_node, int) else None
            )
            if code:
                return code
            os.environ[DONE_ENV] = "1"
        return run_local(cfg, nodes, own_store or cfg.coordinator == "etcd")
    argv_, env = torchrun_argv(cfg), launch_env(cfg)
    if a.print_only:
        print(format_argv(argv_, shown_env(env) | {k: env[k] for k in ("T5_NODE_RANK",) if k in env}))
        return 0
    print(f"[launch] {format_argv(argv_, shown_env(env))}", flush=True)
    os.execvpe(argv_[0], argv_, env)  # the agent replaces us: signals from Slurm/kubelet reach it directly
    return 127  # not reached

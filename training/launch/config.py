"""The launch configuration: one typed, validated :class:`LaunchConfig` per torchrun agent.

Every platform mapping (:mod:`training.launch.from_env`) and the CLI flags produce this object; the command
lines are derived from it in :mod:`training.launch.commands`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

# RDZV_ENV, IDENTICAL_WORKERS_ENV: torchrun's environment, shared with the EKS runtime (re-exported here)
from cluster_facts import IDENTICAL_WORKERS_ENV, RDZV_ENV, PlatformTimeouts, platform_timeouts  # noqa: F401
from training.launch.rendezvous.rounds import ETCD_MAX_TXN_OPS, MAX_ROUND_NODES

DEFAULT_RDZV_PORT = 29400
_LOCAL = platform_timeouts("local")


#: etcd's shortest lease TTL (s): it raises a shorter one to 1.5 x the members' election timeout (1 s,
#: training.launch.rendezvous.members), rounded up; the keep-alive's interval x attempts is the TTL.
ETCD_MIN_LEASE_S = 2
#: Where agents keep their membership (LaunchConfig.coordinator).
COORDINATORS = ("etcd", "store")


class LaunchError(ValueError):
    """A bad launch setting or a missing cluster variable; the message names it and the fix."""


@dataclass(frozen=True)
class RdzvTuning:
    """c10d dynamic-rendezvous timing (seconds), passed as ``--rdzv-conf``.

    Measured with agents on loopback, from killing a node to the survivor's next step: 49.5 s with torch's
    defaults, 23.8 s with these timeouts, 11.8 s adding a 1 s x 2 keep-alive (torch's c10d store, before etcd).
    On etcd (``coordinator`` etcd) interval x attempts is the membership lease's TTL and the agent renews it
    every third of that: 1 s x 2 = 2 s, etcd's shortest (1.5 x its 1 s election timeout, rounded up), found a
    lost node ~0.6 s sooner than 1 s x 3 (node loss -> next step 4.0-4.7 s against 4.5-5.3 s, docs/failover.md).

    Attributes:
        last_call_timeout: after MIN nodes joined, wait this long for more before closing the round.
        close_timeout: how long closing the rendezvous may take.
        join_timeout: how long a round may wait to reach MIN nodes (a replacement node's boot time).
        read_timeout: store read timeout for rendezvous operations.
        keep_alive_interval: agent heartbeat period.
        keep_alive_max_attempt: missed heartbeats before a node is declared dead
            (node-loss detection = interval x attempts).
    """

    last_call_timeout: int = 3
    close_timeout: int = 10
    join_timeout: int = _LOCAL.rdzv_join_timeout_s
    read_timeout: int = 30
    keep_alive_interval: int = 1
    keep_alive_max_attempt: int = 2


@dataclass(frozen=True)
class LaunchConfig:
    """Everything that decides one torchrun agent's command line.

    Attributes:
        min_nodes: fewest nodes the job keeps training with (MIN of ``--nnodes``); below it, it waits up
            to ``tuning.join_timeout`` for replacements. ``min_nodes == max_nodes`` = fixed-size job.
        max_nodes: nodes the job grows back to (MAX of ``--nnodes``).
        spares: hot spares: nodes started beyond ``max_nodes`` whose agents wait in the etcd rendezvous
            (members without a seat) and take a lost node's place in the next round, so the world size does not
            shrink. Same command line as a training node; which agents train is decided by who is up when the
            first round closes (ranks among them follow ``node_rank``).
        nproc_per_node: worker processes per node (int, or torchrun's "gpu"/"cpu"/"auto").
        rdzv_endpoint: HOST:PORT of the rendezvous store.
        rdzv_id: job identity in the store; all agents of one job attempt share it. A relaunch after the
            job ended (requeue) should use a new id: a finished job closes its rendezvous for good.
        coordinator: where the agents keep their membership: ``etcd`` (the default: a 3-member etcd cluster,
            the ``t5-etcd`` rendezvous of :mod:`training.launch.rendezvous`; the agents get its endpoints and the
            job's credentials as ``T5_ETCD_*`` variables, ``etcd_env``) or ``store`` (torch's c10d rendezvous on
            ``rdzv_endpoint``: the fallback of a cluster that gives no etcd, ``T5_COORDINATOR=store`` locally).
            The platform mappings (:mod:`training.launch.from_env`) always set it.
        etcd_env: the ``T5_ETCD_*`` variables of the job's etcd credentials (``coordinator`` etcd).
        external_store: True when ``rdzv_endpoint`` is a standalone store no training node hosts
            (``python -m training.rdzv_store``); agents then only connect (``is_host=false``). False:
            the agent on the endpoint host serves the store (plain c10d; the job dies with that node).
        max_restarts: worker-group restarts per agent before the job fails (node joins don't count).
        tuning: rendezvous timeouts and keep-alive.
        shutdown_timeout_s: seconds an agent waits after SIGTERM-ing its workers before SIGKILL; must
            cover a checkpoint-on-signal.
        train_timeout_s: process-group timeout after the first step (hang detection), passed to the
            training core as ``--parallel.train_timeout_s`` unless the training args set it; 0 = don't.
        init_timeout_s: process-group timeout until the first step (``--parallel.init_timeout_s``), same rule.
        checkpoint_timeout_s: the checkpoint group's timeout (``--checkpoint.timeout_s``), same rule.
        The four timeouts and ``tuning.join_timeout`` default to the platform's row of
        ``cluster_facts.TIMEOUTS`` (local here; the Slurm and PET mappings use theirs).
        node_rank: this node's index as the cluster numbers it, exported as T5_NODE_RANK: the etcd
            rendezvous gives the job's first round's ranks in this order (node i, rank i); later rounds keep
            survivors' ranks and give a lost node's to a spare.
        module: Python module each worker runs (``torchrun --module``).
        train_args: arguments for the training module.
        python: interpreter that runs the torchrun agent (``python -m training.launch.agent``).
    """

    min_nodes: int = 1
    max_nodes: int = 2
    spares: int = 0
    nproc_per_node: int | str = 1
    rdzv_endpoint: str = f"127.0.0.1:{DEFAULT_RDZV_PORT}"
    rdzv_id: str = "t5-local"
    coordinator: str = "etcd"
    etcd_env: tuple[tuple[str, str], ...] = ()
    external_store: bool = True
    max_restarts: int = 3
    tuning: RdzvTuning = field(default_factory=RdzvTuning)
    shutdown_timeout_s: int = _LOCAL.shutdown_timeout_s
    train_timeout_s: int = _LOCAL.train_pg_timeout_s
    init_timeout_s: int = _LOCAL.init_pg_timeout_s
    checkpoint_timeout_s: int = _LOCAL.checkpoint_pg_timeout_s
    node_rank: int | None = None
    module: str = "training"
    train_args: tuple[str, ...] = ()
    python: str = sys.executable

    def validate(self) -> None:
        """Raise :class:`LaunchError` naming the bad value and the fix."""
        if self.min_nodes < 1:
            raise LaunchError(f"min nodes {self.min_nodes} < 1: use --min-nodes 1 or more")
        if self.max_nodes < self.min_nodes:
            raise LaunchError(
                f"max nodes {self.max_nodes} < min nodes {self.min_nodes}: lower --min-nodes or raise --nodes"
            )
        if self.spares < 0:
            raise LaunchError(f"spares {self.spares} < 0: use --spares 0 (none) or more")
        if isinstance(self.nproc_per_node, int):
            if self.nproc_per_node < 1:
                raise LaunchError(f"--nproc-per-node {self.nproc_per_node} < 1")
        elif self.nproc_per_node not in ("gpu", "cpu", "auto"):
            raise LaunchError(f"--nproc-per-node {self.nproc_per_node!r}: use an integer, gpu, cpu or auto")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise LaunchError(
                f"rendezvous endpoint {self.rdzv_endpoint!r} is not HOST:PORT (e.g. 127.0.0.1:{DEFAULT_RDZV_PORT})"
            )
        if not self.rdzv_id or any(c.isspace() or c in ",=" for c in self.rdzv_id):
            raise LaunchError(f"rendezvous id {self.rdzv_id!r} must be non-empty without spaces, ',' or '='")
        if self.coordinator not in COORDINATORS:
            raise LaunchError(
                f"coordinator {self.coordinator!r}: use one of {', '.join(COORDINATORS)} (T5_COORDINATOR)"
            )
        if self.coordinator == "etcd" and self.max_nodes > MAX_ROUND_NODES:
            raise LaunchError(
                f"max nodes {self.max_nodes}: a round on etcd holds at most {MAX_ROUND_NODES:,} nodes "
                f"(its seats are written in one transaction, within etcd's {ETCD_MAX_TXN_OPS} "
                f"operations); use --nodes {MAX_ROUND_NODES} or fewer"
            )
        if self.spares and self.coordinator != "etcd":
            raise LaunchError(
                f"{self.spares} hot spare(s) need the etcd coordinator (torch's c10d rendezvous "
                f"restarts forever with a spare waiting): unset T5_COORDINATOR=store / "
                f"--rdzv-endpoint, or use --spares 0"
            )
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts} < 0")
        if self.shutdown_timeout_s < 1:
            raise LaunchError(f"--shutdown-timeout {self.shutdown_timeout_s} < 1 s")
        if self.train_timeout_s < 0:
            raise LaunchError(f"--train-timeout-s {self.train_timeout_s} < 0 (0 = leave to the training config)")
        t = self.tuning
        if t.keep_alive_interval < 1 or t.keep_alive_max_attempt < 1:  # 0 never heartbeats or never gives up
            raise LaunchError(
                f"--keep-alive {t.keep_alive_interval}x{t.keep_alive_max_attempt}: the interval (s) and "
                f"the attempts must both be >= 1 (a node counts as lost after interval x attempts "
                f"seconds without a heartbeat); use e.g. --keep-alive 1x2"
            )
        if self.coordinator == "etcd" and t.keep_alive_interval * t.keep_alive_max_attempt < ETCD_MIN_LEASE_S:
            raise LaunchError(
                f"--keep-alive {t.keep_alive_interval}x{t.keep_alive_max_attempt}: etcd's shortest "
                f"lease is {ETCD_MIN_LEASE_S} s (1.5 x its election timeout, rounded up); use e.g. "
                f"--keep-alive 1x2"
            )
        if self.tuning.join_timeout < 1:
            raise LaunchError(
                f"--join-timeout {self.tuning.join_timeout} < 1 s: give a replacement node time to boot (default 120)"
            )


def with_platform_timeouts(cfg: LaunchConfig, timeouts: PlatformTimeouts) -> LaunchConfig:
    """``cfg`` with every timeout (and the rendezvous join timeout) taken from a platform's row."""
    from dataclasses import replace

    return replace(
        cfg,
        shutdown_timeout_s=timeouts.shutdown_timeout_s,
        train_timeout_s=timeouts.train_pg_timeout_s,
        init_timeout_s=timeouts.init_pg_timeout_s,
        checkpoint_timeout_s=timeouts.checkpoint_pg_timeout_s,
        tuning=replace(cfg.tuning, join_timeout=timeouts.rdzv_join_timeout_s),
    )

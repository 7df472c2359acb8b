"""How long each layer of a training job waits, per platform: one table, so that the layers nest.

From the inside out, a stop request (SIGTERM) must get through these in order without the outer one cutting
the inner one off:

1. a worker finishes its step and writes a checkpoint synchronously (after any background save in flight);
2. the torchrun agent waits ``shutdown_timeout_s`` for its workers before it SIGKILLs them;
3. the platform waits ``grace_s`` for the agent before it kills everything (Kubernetes
   ``terminationGracePeriodSeconds``; Slurm sends ``--signal=B:USR1@grace_s`` that long before the time
   limit; locally, the supervisor of the agents).

So ``grace_s`` exceeds ``shutdown_timeout_s`` by at least :data:`SHUTDOWN_MARGIN_S`, and
``shutdown_timeout_s`` covers a step plus two full checkpoint writes of the largest preset a platform runs
(the test in tests/unit/cluster_facts/test_cluster_facts.py states the model size and storage bandwidth behind the
values).

Platforms: ``local`` (simulated nodes on one machine, CPU presets), ``slurm`` (ParallelCluster, and the
local Slurm lab), ``eks`` (Kubeflow Trainer on EKS). Both clusters checkpoint to the stack's FSx for Lustre.
"""

from __future__ import annotations

from dataclasses import dataclass

SHUTDOWN_MARGIN_S = 30
"""Least time between the agent's shutdown timeout and the platform's kill: the agent SIGKILLs and reaps its
workers and exits; Slurm runs scancel and the step teardown, or the kubelet stops the container."""


@dataclass(frozen=True)
class PlatformTimeouts:
    """Timeouts (seconds) of one platform; every consumer reads them from :data:`TIMEOUTS`."""

    init_pg_timeout_s: int
    """Process-group timeout until the first step completes (``--parallel.init_timeout_s``): covers the
    rendezvous, the checkpoint load (ranks finish it at different times) and NCCL's first connections."""
    train_pg_timeout_s: int
    """Process-group timeout after step 1 (``launch --train-timeout-s`` -> ``--parallel.train_timeout_s``):
    how long a collective waits for a hung peer before the job fails and restarts. Short: a hung peer is
    found in this long instead of NCCL's 10-minute watchdog; long enough for a slow file-system moment on
    rank 0 or the first async save's buffer allocation not to cost a restart."""
    checkpoint_pg_timeout_s: int
    """Timeout of the checkpoint process group (gloo, its own group: ``--checkpoint.timeout_s``). Its
    collectives wait for the slowest rank's write, so it must cover a full save with a slowed file system."""
    shutdown_timeout_s: int
    """torchrun ``--shutdown-timeout``: how long an agent waits for its workers after SIGTERM (they finish
    the step and save) before it SIGKILLs them."""
    grace_s: int
    """The platform's own wait between SIGTERM and SIGKILL: pod ``terminationGracePeriodSeconds`` on EKS, the
    ``--signal=B:USR1@<grace_s>`` lead time before the Slurm time limit, the wait of a local supervisor."""
    rdzv_join_timeout_s: int
    """Rendezvous ``join_timeout`` (``launch --join-timeout``): how long a round waits for the missing nodes
    (a replacement pod scheduled and its image pulled; a pyxis image import on each Slurm node)."""

    def __post_init__(self) -> None:
        if self.grace_s < self.shutdown_timeout_s + SHUTDOWN_MARGIN_S:
            raise ValueError(
                f"grace_s={self.grace_s} must exceed shutdown_timeout_s={self.shutdown_timeout_s} "
                f"by at least {SHUTDOWN_MARGIN_S} s"
            )


TIMEOUTS: dict[str, PlatformTimeouts] = {
    # CPU presets on one machine: a t5-60m save takes seconds; hang detection in tens of seconds.
    "local": PlatformTimeouts(
        init_pg_timeout_s=300,
        train_pg_timeout_s=30,
        checkpoint_pg_timeout_s=600,
        shutdown_timeout_s=60,
        grace_s=120,
        rdzv_join_timeout_s=120,
    ),
    # GPU presets on FSx: a full t5-3b save takes ~2 min at the default FSx throughput. A hung peer is found
    # within a minute: far above a step (t5-large 0.5 s on an H100) or the first async save's staging (7.7 s),
    # and training never waits on a write in a collective of the training group.
    "slurm": PlatformTimeouts(
        init_pg_timeout_s=600,
        train_pg_timeout_s=60,
        checkpoint_pg_timeout_s=1800,
        shutdown_timeout_s=300,
        grace_s=360,
        rdzv_join_timeout_s=600,
    ),
    "eks": PlatformTimeouts(
        init_pg_timeout_s=600,
        train_pg_timeout_s=60,
        checkpoint_pg_timeout_s=1800,
        shutdown_timeout_s=300,
        grace_s=360,
        rdzv_join_timeout_s=600,
    ),
}


def platform_timeouts(platform: str) -> PlatformTimeouts:
    """The timeouts of ``platform`` (``local``, ``slurm`` or ``eks``)."""
    try:
        return TIMEOUTS[platform]
    except KeyError:
        raise ValueError(f"platform {platform!r} has no timeouts; use one of {', '.join(TIMEOUTS)}") from None

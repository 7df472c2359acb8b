"""The chaos scenarios by name: one name means the same fault on every platform.

Each platform harness implements the subset it can inject (``PLATFORMS``) and says so in ``--help`` and
``--list``; an unknown or unsupported name is refused with the supported list.
"""

from __future__ import annotations

SCENARIOS: dict[str, str] = {
    "worker-kill": "SIGKILL one training process: its node's agent restarts the worker group, the job resumes",
    "worker-kill-in-place": "SIGKILL one training process of a failover.in_place job: its agent replaces it "
    "alone, the other workers keep their processes and recover in place, the job goes on",
    "node-kill": "a whole node dies (every process on it; Slurm marks it DOWN; on Kubernetes its pod goes)",
    "node-loss-rejoin": "a node dies, the job continues on fewer nodes, the node rejoins and the job grows back",
    "network-cut": "take a node's network link down mid-training: its processes run on, cut off (a partition)",
    "silent-node": "SIGSTOP a whole node (sockets stay open): its stopped keep-alives declare it lost, "
    "the job re-forms",
    "node-kill-with-spare": "a node dies while a hot spare waits in the rendezvous: the spare takes its place, "
    "the world size never shrinks",
    "node-kill-in-place": "a node of a failover.in_place job dies while a hot spare waits: the spare's workers join "
    "the survivors' running epoch in the lost ranks, the survivors keep their processes, the job goes on",
    "first-node-kill-in-place": "the node running rank 0 of a failover.in_place job dies while a hot spare waits: "
    "the spare takes node rank 0 and the round's store, its workers join the survivors' epoch in the lost ranks, "
    "the survivors keep their processes and ranks, the job goes on",
    "silent-node-in-place": "a node of a failover.in_place job goes silent (SIGSTOP) while a hot spare waits: once "
    "its lease ends the spare's workers join the survivors' epoch, a survivor blocked on it cuts its group at its "
    "agent's request and keeps its process, the group never restarts",
    "silent-node-during-save": "a node goes silent (SIGSTOP) as a checkpoint write starts, a hot spare waits: "
    "it is declared lost in seconds, the spare takes its place",
    "straggler": "a training node runs at a fraction of its speed while a hot spare waits (local: stopped 0.2 s of "
    "every 0.3 s; Slurm lab: a CPU quota): it is named from the ranks' work times and taken out after a "
    "snapshot; the spare replaces it",
    "straggler-in-place": "a training node of a failover.in_place job runs at a fraction of its speed while a hot "
    "spare waits: it is named and taken out after a snapshot, only its workers stop; the spare's workers join the "
    "survivors' epoch in its ranks, the survivors keep their processes, the job goes on",
    "first-node-kill": "the node running rank 0 dies; a replacement joins (the rendezvous store lives elsewhere)",
    "preemption": "a termination notice (SIGTERM / Slurm's pre-timeout SIGUSR1): checkpoint, exit, resume, 0 lost",
    "hang": "SIGSTOP one worker: the process-group timeout detects the hang and the job restarts",
    "wedged-rank": "one rank's main thread blocks mid-step while its process and heartbeat thread live on: its "
    "progress stops, it is declared wedged in one line, its agent SIGKILLs it, the job resumes",
    "node-pair-loss": "two adjacent nodes of three die at once: a shard and its replica are gone, storage restores",
    "kill-mid-snapshot": "a worker is SIGKILLed halfway through copying its in-memory snapshot: the previous is used",
    "kill-during-save": "SIGKILL rank 0 while an async checkpoint is written but not committed: it is ignored",
    "corrupt-checkpoint": "truncate a shard of the newest checkpoint, then kill a worker: resume from the previous",
    "corrupt-snapshot": "damage a frozen worker's newest in-memory snapshot, SIGKILL it: its peer's replica is "
    "restored; then damage its replicas too: storage is (each damaged copy named)",
    "restarts-exhausted": "more worker failures than --max-restarts: the job fails cleanly, checkpoints intact",
    "node-drain": "drain the Kubernetes node under a training pod (cordon + evict)",
    "batch-host-kill": "the node running the Slurm batch script dies: the allocation ends, Slurm requeues the job",
    "store-member-kill": "SIGKILL the etcd member that leads (of 3): a new leader, training goes on, 0 steps lost",
    "store-outage": "every etcd member stopped for 20 s, then back: training goes on, the agents reconnect",
    "store-outage-then-worker-kill": "a worker dies while no etcd member answers: the new round waits for the store "
    "and trains again within seconds of its return",
    "split-brain": "SIGSTOP the training nodes' agents only (their workers train on) until the hot spares form a new "
    "round: two worker groups of one job; the commit fence stops the old one at its next commit, only the new "
    "group's checkpoints complete",
}

PLATFORMS: dict[str, tuple[str, ...]] = {
    "local": (
        "worker-kill",
        "worker-kill-in-place",
        "node-loss-rejoin",
        "silent-node",
        "node-kill-with-spare",
        "node-kill-in-place",
        "first-node-kill-in-place",
        "silent-node-in-place",
        "silent-node-during-save",
        "straggler",
        "straggler-in-place",
        "first-node-kill",
        "preemption",
        "hang",
        "wedged-rank",
        "kill-mid-snapshot",
        "node-pair-loss",
        "kill-during-save",
        "corrupt-checkpoint",
        "corrupt-snapshot",
        "restarts-exhausted",
        "store-member-kill",
        "store-outage",
        "store-outage-then-worker-kill",
        "split-brain",
    ),
    "slurm": (
        "node-kill",
        "first-node-kill",
        "network-cut",
        "worker-kill",
        "worker-kill-in-place",
        "node-kill-in-place",
        "first-node-kill-in-place",
        "preemption",
        "batch-host-kill",
        "store-member-kill",
        "store-outage",
        "store-outage-then-worker-kill",
        "straggler",
        "straggler-in-place",
        "wedged-rank",
        "split-brain",
    ),
    "eks": ("node-kill", "first-node-kill", "node-drain"),
}


class UnknownScenario(ValueError):
    """A scenario name that does not exist or that the platform cannot inject."""


def select(platform: str, spec: str) -> list[str]:
    """Scenario names from a comma-separated ``spec`` ("all" or "" = every scenario the platform supports)."""
    supported = PLATFORMS[platform]
    if spec.strip() in ("", "all"):
        return list(supported)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in supported]
    if bad:
        where = [f"{n} (not on {platform})" if n in SCENARIOS else n for n in bad]
        raise UnknownScenario(f"unknown scenario(s) {', '.join(where)}; {platform} supports: {', '.join(supported)}")
    return names


def listing(platform: str) -> str:
    """One line per scenario the platform supports: name and what it does."""
    return "\n".join(f"{n:<20} {SCENARIOS[n]}" for n in PLATFORMS[platform])

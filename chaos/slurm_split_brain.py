"""The split-brain scenario on Slurm (``python -m chaos.slurm --scenarios split-brain``): two worker groups of one job
in one allocation, and the commit fence between them.

As the local harness does it (:mod:`chaos.local.split_brain`): the job runs with a hot spare per training node; once
it logged the fault step, the harness SIGSTOPs the torchrun agents (only) of every training node: their workers
train on, a group whose agents are gone from etcd, while the agents' leases end and the spares form the job's next
round, a second group. The job is held at a step boundary (``--fault.hold_file``) until the spares run workers, then
let go: the old group reaches its next commit, which the fence refuses (one line, exit 9), and the new group restores
and finishes. Once the old workers are gone the agents are let go (SIGCONT) and end with exit 9. The phases are
:func:`chaos.split_brain.freeze_agents`, which the Kubernetes contract emulator runs too.

What is Slurm's own: a task that exits non-zero makes ``srun --kill-on-bad-exit`` kill every task of the step, the
newer group's included, and the batch script would then requeue the job. The node agent of the batch script
(``cluster_assets/slurm/job.sbatch.in``) turns exit 9 into exit 0 with one line (:data:`FENCED_NODE_LINE`): the fenced
nodes leave the step and the newer group finishes the job in its allocation. :func:`check_fenced_nodes_left` reads
that from the job log and Slurm's record; :func:`chaos.local.split_brain.check_stale_group_fenced` (every platform)
the fence's line and the commit markers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chaos.split_brain import HOLD_FILE, agent_pid, freeze_agents
from chaos.verdict import Check, Fault, Observation

if TYPE_CHECKING:
    from chaos.slurm import Lab, Target

#: The node agent's line when its torchrun agent ended with the fence's exit code (job.sbatch.in's NODE_AGENT).
FENCED_NODE_LINE = "was replaced by a newer round (the commit fence stopped it, agent exit 9)"
FENCED_NODES_LEFT = "the fenced nodes left the step, the newer group finished the job in its allocation"


def split_brain(lab: "Lab", t: "Target") -> Fault:
    """SIGSTOP the agents of every training node with the job held at its next step boundary until every spare runs
    workers (the second group), let the job go, wait until the old group's workers exited, SIGCONT its agents
    (:func:`chaos.split_brain.freeze_agents`). Confirmed when every agent stopped while its workers ran on, and the
    spares' group formed beside them."""
    hosts = t.watch.get("hosts", [])
    ranks = lab.worker_ranks(hosts)
    training, spares = [h for h in hosts if ranks[h]], [h for h in hosts if not ranks[h]]
    facts = t.watch.setdefault("facts", {})
    facts.update(stale_nodes=training, spare_nodes=spares)
    start = time.time()
    label = f"SIGSTOP the agents of {', '.join(training) or 'no node'}"
    if not training or len(spares) < len(training):
        return Fault(label, start, False, f"needs a spare per training node: training {training}, spares {spares}")
    agents = {h: agent_pid(lab.pids(h)) for h in training}
    if None in agents.values():
        return Fault(label, start, False, f"no torchrun agent found on {agents}")

    def say(what: str, detail: str) -> None:
        print(
            f"[chaos-slurm {time.strftime('%H:%M:%S')}] {t.scenario} after step {t.last_step}: {what}: {detail}",
            flush=True,
        )

    workers = {p for h in training for p in lab.worker_pids(h)}
    fz = freeze_agents(agents, workers, t.run_dir / HOLD_FILE, lambda: all(lab.worker_ranks(spares).values()), say)
    facts.update(second_group_s=fz.second_group_s, old_group_exited_s=fz.old_group_exited_s)
    return Fault(label, start, fz.confirmed, fz.evidence(spares))


def check_fenced_nodes_left(obs: Observation) -> Check:
    """Every node of the fenced group left the step with its node agent's line (exit 0, not srun's kill of the whole
    step), no requeue, and the job COMPLETED."""
    stale = obs.facts.get("stale_nodes") or []
    lines = [line.strip() for _, line in obs.logs if FENCED_NODE_LINE in line]
    requeues, state = obs.facts.get("requeues"), obs.facts.get("final_state")
    ok = bool(stale) and len(lines) == len(stale) and requeues == 0 and state == "COMPLETED"
    return Check(
        FENCED_NODES_LEFT,
        ok,
        f"{len(lines)} node agent(s) left the step as fenced (the old group ran on {stale or 'no node'})"
        + (f", e.g. {lines[0][:160]!r}" if lines else "")
        + f"; {requeues} requeue(s), final state {state}",
    )

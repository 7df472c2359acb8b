"""The split-brain scenario on Slurm (``python -m chaos.slurm --scenarios split-brain``): two worker groups of one job
in one allocation, and the commit fence between them.

As the local harness does it (:mod:`chaos.local.split_brain`): the job runs with a hot spare per training node; once
it logged the fault step, the harness SIGSTOPs the torchrun agents (only) of every training node: their workers
train on, a group whose agents are gone from etcd, while the agents' leases end and the spares form the job's next
round, a second group. The job is held at a step boundary (``--fault.hold_file``) until the spares run workers, then
let go: the old group reaches its next commit, which the fence refuses (one line, exit 9), and the new group restores
and finishes. Once the old workers are gone the agents are let go (SIGCONT) and end with exit 9.

What is Slurm's own: a task that exits non-zero makes ``srun --kill-on-bad-exit`` kill every task of the step, the
newer group's included, and the batch script would then requeue the job. The node agent of the batch script
(``cluster_assets/slurm/job.sbatch.in``) turns exit 9 into exit 0 with one line (:data:`FENCED_NODE_LINE`): the fenced
nodes leave the step and the newer group finishes the job in its allocation. :func:`check_fenced_nodes_left` reads
that from the job log and Slurm's record; :func:`chaos.local.split_brain.check_stale_group_fenced` (every platform)
the fence's line and the commit markers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from chaos.verdict import Check, Fault, Observation

if TYPE_CHECKING:
    from chaos.slurm import Lab, Target

#: The job's hold file (``--fault.hold_file``), in its run directory: every rank waits after its step while it exists.
HOLD_FILE = "hold-after-step"
#: The node agent's line when its torchrun agent ended with the fence's exit code (job.sbatch.in's NODE_AGENT).
FENCED_NODE_LINE = "was replaced by a newer round (the commit fence stopped it, agent exit 9)"
FENCED_NODES_LEFT = "the fenced nodes left the step, the newer group finished the job in its allocation"
#: Longest wait for each phase: the spares' round to form (a lease's expiry, then a round), the old group to exit.
PHASE_TIMEOUT_S = 180.0
AGENT_MODULE = "training.launch.agent"


def _cmdline(pid: int | None) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat`` fields after the command name (state, ppid, ...); empty when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields else None


def agent_pid(pids: set[int]) -> int | None:
    """The torchrun agent among a node's processes: it runs ``training.launch.agent`` and its parent (the node
    agent's bash) does not; its warm workers' forkserver, forked from it, has the same command line."""
    agents = []
    for p in pids:
        fields = _stat(p)
        if len(fields) > 1 and AGENT_MODULE in _cmdline(p) and AGENT_MODULE not in _cmdline(int(fields[1])):
            agents.append(p)
    return min(agents) if agents else None


def _wait(pred: Callable[[], object], timeout_s: float, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(poll_s)


def split_brain(lab: "Lab", t: "Target") -> Fault:
    """SIGSTOP the agents of every training node with the job held at its next step boundary until every spare runs
    workers (the second group), let the job go, wait until the old group's workers exited, SIGCONT its agents.
    Confirmed when every agent stopped while its workers ran on, and the spares' group formed beside them."""
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
        return Fault(label, start, False, f"no torchrun agent ({AGENT_MODULE}) found on {agents}")
    workers = {p for h in training for p in lab.worker_pids(h)}
    hold = t.run_dir / HOLD_FILE
    hold.touch()
    try:
        for pid in agents.values():
            os.kill(pid, signal.SIGSTOP)
        stopped = {h: _wait(lambda p=pid: _state(p) in ("T", "t"), 5, 0.02) for h, pid in agents.items()}
        running = {p: _state(p) for p in workers}
        print(
            f"[chaos-slurm {time.strftime('%H:%M:%S')}] {t.scenario}: SIGSTOPped the agents {agents} after step "
            f"{t.last_step}; their workers {running}; waiting for the spares {spares} to form a round",
            flush=True,
        )
        formed = _wait(lambda: all(lab.worker_ranks(spares).values()), PHASE_TIMEOUT_S)
        facts["second_group_s"] = round(time.time() - start, 1) if formed else None
    finally:
        hold.unlink(missing_ok=True)
        try:
            exited = _wait(lambda: all(_state(p) in (None, "Z", "X") for p in workers), PHASE_TIMEOUT_S)
            facts["old_group_exited_s"] = round(time.time() - start, 1) if exited else None
        finally:
            for pid in agents.values():
                os.kill(pid, signal.SIGCONT)
    ok = all(stopped.values()) and bool(running) and not {"T", "t", None} & set(running.values()) and bool(formed)
    return Fault(
        label,
        start,
        ok,
        f"agents {agents} stopped: {stopped}; their workers' states then {running}; the spares {spares} ran "
        + (f"workers {facts['second_group_s']} s later (a second group)" if formed else "no workers (no second group)")
        + f"; the old group's workers exited {facts.get('old_group_exited_s')} s after the stop, then SIGCONT",
    )


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

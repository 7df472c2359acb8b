"""The split-brain scenario of the local harness: two worker groups of one job, and the commit fence between them.

A fixed-size job trains with as many hot spares as it has nodes. The harness SIGSTOPs the training nodes' agents
only (:func:`inject_split_brain`): their workers train on, a worker group whose agents are gone from etcd, while
the agents' leases end and the spares form the job's next round, a second worker group (the window torch's
contract leaves: an agent frozen, or cut off from the store, while its workers run). The job is held at a step
boundary until that round exists, then let go: the old group reaches its next commit, which the commit fence
refuses (:mod:`training.checkpoint.fence`, one line, exit 9), and the new group, waiting for the checkpoint
directory's run lock until then, restores and finishes. :func:`check_stale_group_fenced` reads the evidence:
the fence's line, and the commit markers left in the checkpoint directory (only the current round's, beside
older rounds' ones no newer than the step it restored from).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from chaos.local.cluster import confirm
from chaos.verdict import Check, Observation
from training.checkpoint.layout import parse_step, read_marker, scan
from training.goodput.analysis import split_attempts
from training.launch.rendezvous.members import process_state

STALE_GROUP_FENCED = "stale group stopped by the commit fence, only the current round's checkpoints complete"
#: The fence's line (training.checkpoint.fence.EtcdFence), as rank 0 of the replaced group prints it.
FENCE_LINE = "the commit fence refused its checkpoint"


def inject_split_brain(run) -> None:
    """SIGSTOP the agents (only) of every training node once the job logged ``kill_step``, the job held at its next
    step boundary until the hot spares formed a new round; let go, wait until the old group stopped, then SIGCONT
    its agents (they end with their workers' exit code; hit by the fault, so not counted against the job)."""
    from chaos.local.scenarios import ScenarioFailed, _needs_etcd, training_and_spares

    _needs_etcd(run)
    run.start_until_kill_step()
    c = run.cluster
    training, spares = training_and_spares(run)
    if len(spares) < len(training):
        raise ScenarioFailed(f"split-brain needs a spare per training node: training {training}, spares {spares}")
    agents = {i: c.current(i).proc.pid for i in training}
    workers = {i: c.workers(i) for i in training}
    run.facts["stale_nodes"], run.facts["spare_nodes"] = training, spares
    with run.held():
        t = time.time()
        for pid in agents.values():
            os.kill(pid, signal.SIGSTOP)
        stopped = [confirm(pid, signal.SIGSTOP) for pid in agents.values()]
        running = {p: process_state(p) for ws in workers.values() for p in ws}
        c.event(
            "fault",
            None,
            f"SIGSTOP the agents of node(s) {training} (pids {sorted(agents.values())}) only; their workers "
            f"{sorted(running)} train on",
            label="SIGSTOP agents",
            agents_hit=tuple(c.current(i).name for i in training),
            t=t,
            confirmed=all(ok for ok, _ in stopped) and bool(running) and not {"T", "t"} & set(running.values()),
            evidence="; ".join(how for _, how in stopped) + f"; worker states {running}",
        )
        names = {c.current(i).name for i in spares}
        formed = run.wait_for(
            lambda: next(
                (line for when, node, line in c.log_lines() if when > t and node in names and ": rank " in line),
                None,
            ),
            "the hot spares to form a new round",
        )
        c.event("second-group", None, f"the spares' round formed beside the running group: {formed.strip()}")
    fenced = run.wait_for(
        lambda: next((line for when, _, line in c.log_lines() if when > t and FENCE_LINE in line), None),
        "the commit fence to stop the old group",
    )
    run.facts["fence_line"] = fenced.strip()
    run.wait_for(
        lambda: all(process_state(p) in (None, "Z", "X") for ws in workers.values() for p in ws),
        "the old group's workers to exit",
    )
    for pid in agents.values():
        os.kill(pid, signal.SIGCONT)
    c.event("thaw", None, f"SIGCONT the old group's agents {sorted(agents.values())} (their workers have exited)")


def committed_rounds(root: Path | None) -> dict[int, int | None]:
    """Step -> the round recorded in its commit marker (None: no fence fields) of every complete checkpoint."""
    if root is None:
        return {}
    good, _ = scan(root)
    return {parse_step(p): (read_marker(p).get("fence") or {}).get("round") for p in reversed(good)}  # oldest first


def check_stale_group_fenced(obs: Observation) -> Check:
    """The replaced group was stopped by the fence (its one line) and no complete checkpoint is its: every commit
    marker names a round, the final one the newest, and any of an older round is no newer than the step the last
    attempt restored from."""
    lines = obs.log_has(FENCE_LINE)
    marks = committed_rounds(obs.checkpoint_dir)
    attempts = split_attempts(obs.records)
    restored = attempts[-1].resumed_from if attempts else 0
    rounds = [r for r in marks.values() if r is not None]
    current = max(rounds, default=None)
    stale = {s: r for s, r in marks.items() if r is None or (r != current and s > restored)}
    final_ok = bool(marks) and marks.get(max(marks)) == current
    ok = len(lines) == 1 and current is not None and not stale and final_ok
    said = (
        lines[0].strip()
        if len(lines) == 1
        else f"{len(lines)} fence lines (one expected)"
        if lines
        else f"no line saying '{FENCE_LINE}'"
    )
    return Check(
        STALE_GROUP_FENCED,
        ok,
        f"{said}; complete checkpoints (step: round) {marks or 'none'}; the last attempt restored from step "
        f"{restored}" + (f"; of a replaced round or without one: {stale}" if stale else ""),
    )

"""Verdict checks of the grey failures (a slow node, a wedged rank), shared by the harnesses that inject them
(``chaos.local.scenarios``, ``chaos.slurm``): plain functions of an :class:`~chaos.verdict.Observation`, reading
the job's own records and log lines and the facts the harness noted (``slow_ranks``, ``slow_until``, ``wedge``).
"""

from __future__ import annotations

import statistics

from chaos.verdict import Check, Observation
from training.goodput.analysis import split_attempts

STRAGGLER_NAMED = "straggler named on the slow node"
BACK_TO_SPEED = "steps slowed by the fault, faster again after the take-over"


def check_straggler_named(obs: Observation) -> Check:
    """After the slowdown began, the job named a rank of the slow node a straggler (a ``straggler`` event) and
    decided to take its node out; the evidence is the event's own figures."""
    t = obs.faults[0].time if obs.faults else float("inf")
    ranks = obs.facts.get("slow_ranks") or []
    named = [r for r in obs.records if r.get("event") == "straggler" and r["time"] > t and r.get("rank") in ranks]
    out = [r for r in named if "taking its node out" in r.get("action", "")]
    wrong = [r for r in obs.records if r.get("event") == "straggler" and r.get("rank") not in ranks]
    ok = bool(ranks) and bool(out) and not wrong
    e = out[0] if out else (named[0] if named else None)
    return Check(
        STRAGGLER_NAMED,
        ok,
        f"rank {e['rank']} (node {e['node']}) at step {e['step']}: {e['work_s']} s vs the others' median "
        f"{e['median_s']} s (x{e['ratio']}) for {e['slow_steps']} steps; {e['action']}"
        + (f"; other ranks named too: {[r['rank'] for r in wrong]}" if wrong else "")
        if e
        else f"no straggler event naming the slow node's rank(s) {ranks}"
        + (f" (named instead: {[r['rank'] for r in wrong]})" if wrong else ""),
    )


def back_to_speed_s(obs: Observation, factor: float = 1.5) -> tuple[float | None, float]:
    """(seconds from the slowdown's start to the first of two consecutive steps within ``factor`` x the normal
    step time once the slowdown had stretched a step beyond it, or None; the normal: the median step time before the
    slowdown, the first step left out). The steps before the slowdown bites (a quota, a duty cycle, takes a step or
    two to show) are not a recovery: the search starts after the last step beyond ``factor`` x normal while the node
    was slowed (``slow_until``; the fault's time when unknown)."""
    t = obs.faults[0].time if obs.faults else float("inf")
    until = obs.facts.get("slow_until") or t
    normal = slowdown(obs.records, t, t)[0]
    after = [r for r in obs.records if r.get("event") == "step" and r["time"] > t]
    stretched = [r["time"] for r in after if r["time"] <= until and r["step_time_s"] > factor * normal]
    after = [r for r in after if r["time"] > max(stretched, default=t)]
    for a, b in zip(after, after[1:]):
        if a["step_time_s"] <= factor * normal and b["step_time_s"] <= factor * normal:
            return a["time"] - t, normal
    return None, normal


def slowdown(records: list[dict], t_fault: float, t_until: float) -> tuple[float, float, float]:
    """(normal step time, median step time while a node was slowed, their ratio) from a run's step records; the
    normal: the median before the fault, the first step left out. The ratio is 0 when either is unknown."""
    steps = [r for r in records if r.get("event") == "step"]
    before = [r["step_time_s"] for r in steps if r["time"] < t_fault][1:]
    slowed = [r["step_time_s"] for r in steps if t_fault < r["time"] <= t_until]
    normal = statistics.median(before) if before else 0.0
    slow = statistics.median(slowed) if slowed else 0.0
    return normal, slow, slow / normal if normal > 0 else 0.0


def check_back_to_speed(obs: Observation) -> Check:
    """The job's own step times show the slowdown (their median while the node was slowed >= 1.2 x the normal) and
    its end (the steps after the take-over faster than the slowed ones). The figure in the detail: how long after
    the slowdown began two consecutive steps ran within 1.5 x the normal again (target <= 30 s; reported, not
    asserted: the machine is shared)."""
    t = obs.faults[0].time if obs.faults else float("inf")
    until = obs.facts.get("slow_until") or 0.0
    took, _ = back_to_speed_s(obs)
    normal, slow_med, ratio = slowdown(obs.records, t, until)
    steps = [r for r in obs.records if r.get("event") == "step"]
    slowed = [r["step_time_s"] for r in steps if t < r["time"] <= until]
    after = [r["step_time_s"] for r in steps if r["time"] > until]
    # 1.2x, not 3x: on the shared cores other processes take the time the stopped node leaves (seen: 1.3-2.8x)
    ok = bool(slowed) and bool(after) and ratio >= 1.2 and statistics.median(after) < slow_med
    figure = f"{took:.1f} s" if took is not None else "not within 1.5x for two steps"
    return Check(
        BACK_TO_SPEED,
        ok,
        f"normal step {normal:.2f} s; while slowed {', '.join(f'{x:.2f}' for x in slowed[:8]) or 'none'} s "
        f"(median {slow_med:.2f}); after the take-over median "
        f"{statistics.median(after) if after else 0:.2f} s; back within 1.5x of normal {figure} after the "
        f"slowdown began (target <= 30 s)",
    )


WEDGE_TARGET_S = 10.0  # issue 34's target for the next step after a wedge (reported, not asserted)


def check_wedge_declared(obs: Observation) -> Check:
    """After the wedge, the wedged rank's own heartbeat thread named it (rank, step, phase, seconds vs the bound)
    and its agent SIGKILLed that very worker for it; the next attempt trained. The figure: seconds from the wedge
    to the next attempt's first step (issue 34's target: <= 10 s, reported only)."""
    w = obs.facts.get("wedge") or {}
    t, rank, pid, step = w.get("time", float("inf")), w.get("rank"), w.get("pid"), w.get("step")
    said = [
        ln
        for at, ln in obs.logs
        if at >= t
        and f"[watchdog] rank {rank} (" in ln
        and "is wedged: no progress in phase" in ln
        and f"of step {step} " in ln
    ]
    killed = [ln for at, ln in obs.logs if at >= t and f"worker pid {pid} (rank {rank}) declared itself wedged" in ln]
    after = [a for a in split_attempts(obs.records) if a.start["time"] > t and a.steps]
    ok = bool(w) and bool(said) and bool(killed) and bool(after)
    figure = (
        f"next step {after[0].steps[0]['time'] - t:.1f} s after the wedge (target <= {WEDGE_TARGET_S:g} s)"
        if ok
        else f"attempts that trained after it: {len(after)}"
    )
    return Check(
        "wedged rank declared and killed by its agent",
        ok,
        f"{said[0].strip()[:240] if said else f'no wedge line for rank {rank} at step {step}'}; "
        f"{killed[0].strip()[:120] if killed else f'no agent kill of pid {pid}'}; {figure}",
    )

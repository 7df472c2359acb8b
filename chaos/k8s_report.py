"""Read a job's metrics JSONL and judge a chaos run: step continuity, steps lost, time to recover.

Shared by the contract emulator (local processes) and the EKS chaos harness (metrics read from FSx through
a pod). Works only from the training contract's events: ``start`` {time, resumed_from, world_size},
``step`` {time, step, step_time_s}, ``checkpoint`` {step}, ``end`` {step}.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_events(text: str) -> list[dict[str, Any]]:
    """Events in file order; a torn last line (being written) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and "event" in e:
            out.append(e)
    return out


def analyze(events: list[dict[str, Any]], faults: list[dict[str, Any]], total_steps: int | None = None,
            ) -> dict[str, Any]:
    """Judge the run. ``faults``: [{"label", "time", ...}] in time order (extra keys are kept).

    Returns continuity (every step 1..N logged, each segment consecutive from its resume point), steps lost
    (recomputed step events), per-fault recovery (fault -> first step of the next segment), completion.
    """
    segments: list[dict[str, Any]] = []
    for e in events:
        if e["event"] == "start":
            segments.append({"start": e, "steps": [], "end": None})
        elif e["event"] == "step":
            if not segments:
                segments.append({"start": {"time": e["time"], "resumed_from": None}, "steps": [], "end": None})
            segments[-1]["steps"].append(e)
        elif e["event"] == "end" and segments:
            segments[-1]["end"] = e
    steps = [e for seg in segments for e in seg["steps"]]
    distinct = sorted({e["step"] for e in steps})
    top = total_steps or (distinct[-1] if distinct else 0)
    missing = [s for s in range(1, top + 1) if s not in set(distinct)]
    problems = []
    for i, seg in enumerate(segments):
        first = (seg["start"].get("resumed_from") or 0) + 1
        got = [e["step"] for e in seg["steps"]]
        if got and got != list(range(first, first + len(got))):
            problems.append(f"segment {i} (resumed from {first - 1}) logged steps {got[:3]}..{got[-3:]}, "
                            f"not consecutive from {first}")
    fault_rows = []
    for f in faults:
        t = f["time"]
        nxt = next((s for s in segments if s["start"]["time"] > t and s["steps"]), None)
        # last step completed before the recovering attempt started (as in chaos/analysis.py)
        cutoff = nxt["start"]["time"] if nxt else float("inf")
        before = [e["step"] for e in steps if e["time"] < cutoff]
        row = dict(f)
        row["last_step_before"] = max(before) if before else 0
        if nxt:
            resumed = nxt["start"].get("resumed_from") or 0
            row.update(resumed_from=resumed, first_step_after=nxt["steps"][0]["step"],
                       recover_s=round(nxt["steps"][0]["time"] - t, 2),
                       restart_to_first_step_s=round(nxt["steps"][0]["time"] - nxt["start"]["time"], 2),
                       steps_lost=max(0, row["last_step_before"] - resumed))
        else:
            row.update(resumed_from=None, first_step_after=None, recover_s=None, steps_lost=None)
        fault_rows.append(row)
    end = next((e for e in reversed(events) if e["event"] == "end"), None)
    completed = bool(end) and (total_steps is None or end.get("step") == total_steps)
    useful = sum(e.get("step_time_s", 0.0) for e in {e["step"]: e for e in steps}.values())
    wall = (end["time"] if end else (steps[-1]["time"] if steps else 0)) - (segments[0]["start"]["time"]
                                                                            if segments else 0)
    return {
        "segments": len(segments),
        "steps_logged": len(steps),
        "distinct_steps": len(distinct),
        "last_step": distinct[-1] if distinct else 0,
        "missing_steps": missing,
        "steps_recomputed": len(steps) - len(distinct),
        "continuity_ok": not missing and not problems,
        "continuity_problems": problems,
        "faults": fault_rows,
        "completed": completed,
        "end_step": end.get("step") if end else None,
        "goodput": round(useful / wall, 3) if wall > 0 else None,
        "wall_s": round(wall, 1),
    }


def emulator_report(emu: Any, metrics_path: Path, t0: float) -> dict[str, Any]:
    """Report of one emulator run; each fault is timed from the emulator's own event log:
    detect = fault -> Job failed, pods_recreated = fault -> the restarted pods were started."""
    text = metrics_path.read_text() if metrics_path.exists() else ""
    faults: list[dict[str, Any]] = [dict(f, detect_s=None, pods_recreated_s=None) for f in emu.fault_log]
    for f in faults:
        later = [ev for ev in emu.events if ev.time > f["time"]]
        failed = next((ev for ev in later if ev.what == "Job failed"), None)
        started = next((ev for ev in later if ev.what in ("pods started", "pod replaced by the Job controller")),
                       None)
        f["detect_s"] = round(failed.time - f["time"], 2) if failed else None
        f["pods_recreated_s"] = round(started.time - f["time"], 2) if started else None
    total = None
    try:
        total_arg = emu.job_arg("--train.steps")
        total = int(total_arg) if total_arg else None
    except ValueError:
        pass
    rep = analyze(parse_events(text), faults, total)
    rep.update(title="Kubernetes contract emulator (Trainer v2.3 + JobSet semantics, pods as local processes)",
               trainjob=emu.r.job_name, state=emu.state, message=emu.message, jobset_restarts=emu.restarts,
               max_restarts=emu.r.max_restarts, pod_failures=emu.pod_failures,
               nodes=emu.r.num_nodes, nproc_per_node=emu.r.nproc_per_node, total_s=round(emu.events[-1].time - t0, 1),
               differences=emu.differences(), metrics=str(metrics_path),
               events=[{"t": round(e.time - t0, 2), "what": e.what, "detail": e.detail} for e in emu.events])
    return rep


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v}{unit}"


def format_report(rep: dict[str, Any]) -> str:
    """Human-readable table (same columns for the emulator and the EKS chaos harness)."""
    lines = [f"=== {rep.get('title', 'chaos report')} ===",
             f"TrainJob {rep.get('trainjob')}: {rep.get('state')}"
             + (f" ({rep['message']})" if rep.get("message") else "")
             + f" | JobSet restarts {rep.get('jobset_restarts')} (maxRestarts {_fmt(rep.get('max_restarts'))})"
             + (f" | pod failures {rep['pod_failures']}" if rep.get("pod_failures") is not None else "")
             + (f" | {rep['nodes']} node(s) x {rep['nproc_per_node']} proc" if rep.get("nodes") else "")]
    hdr = (f"{'fault':<28} {'last step':>9} {'detect':>8} {'new pods':>9} {'recover':>9} {'lost':>5} "
           f"{'resumed from':>12}")
    lines += [hdr, "-" * len(hdr)]
    for f in rep["faults"]:
        lines.append(f"{f['label'][:28]:<28} {f['last_step_before']:>9} {_fmt(f.get('detect_s'), ' s'):>8} "
                     f"{_fmt(f.get('pods_recreated_s'), ' s'):>9} {_fmt(f.get('recover_s'), ' s'):>9} "
                     f"{_fmt(f.get('steps_lost')):>5} "
                     f"{_fmt(f.get('resumed_from')):>12}")
    if not rep["faults"]:
        lines.append("(no faults injected)")
    cont = "OK" if rep["continuity_ok"] else "BROKEN: " + "; ".join(
        ([f"missing steps {rep['missing_steps'][:10]}"] if rep["missing_steps"] else []) + rep["continuity_problems"])
    lines += [f"steps: {rep['distinct_steps']} distinct (last {rep['last_step']}), {rep['steps_recomputed']} "
              f"recomputed after restarts, {rep['segments']} segment(s); continuity {cont}",
              f"completed: {'yes' if rep['completed'] else 'NO'} (end at step {_fmt(rep['end_step'])}); "
              f"goodput {_fmt(rep['goodput'])} over {rep['wall_s']} s of training wall time"
              + (f"; total {rep['total_s']} s" if rep.get("total_s") is not None else "")]
    if rep.get("bitwise") is not None:
        lines.append(f"final weights vs uninterrupted reference: {rep['bitwise']}")
    lines.append("detect: fault -> Job failed (or JobSet restart seen); new pods: fault -> replacement pods "
                 "created; recover: fault -> first step of the resumed attempt; lost: steps recomputed")
    for d in rep.get("differences") or []:
        lines.append(f"  emulated: {d}")
    return "\n".join(lines)

"""The chaos report for every platform: a pass/fail table, ``report.json`` and a PNG timeline
(drawn by :mod:`training.goodput.timeline`, the same picture as an ordinary run's goodput ledger).

Harnesses turn each scenario run into a :class:`ScenarioResult` (the verdict plus what happened when); this
module prints and saves them the same way whatever the platform.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos.verdict import Check, Verdict
from training.goodput import timeline
from training.goodput.analysis import BREAKDOWN, Recovery, goodput
from training.goodput.timeline import Mark, Timeline

# (label, scenario, which figure, target, comparison) -- reported, never asserted: this machine is shared.
# A target of None means the steps a failure may cost: the in-memory snapshot interval where that tier is on,
# else the checkpoint interval.
TARGETS = [
    ("worker kill -> next step (s)", "worker-kill", "recover_s", 10.0, "<="),
    ("node loss -> next step (s)", "node-loss-rejoin", "recover_s", 15.0, "<="),
    ("rejoin -> next full-size step (s)", "node-loss-rejoin:rejoin", "recover_s", 12.0, "<="),
    ("hang detected (s)", "hang", "detect_s", 30.0, "<="),
    ("wedged rank -> next step (s)", "wedged-rank", "recover_s", 10.0, "<="),  # issue 34 (60 s before)
    ("slow node (a spare waiting) -> the spare's first step (s)", "straggler", "recover_s", 30.0, "<="),
    ("steps lost on a termination notice", "preemption", "steps_lost", 0, "=="),
    (
        "steps lost on SIGKILL (worker, node, first node)",
        "worker-kill,node-kill,node-loss-rejoin,first-node-kill",
        "steps_lost",
        None,
        "<=",
    ),
]


@dataclass
class ScenarioResult:
    """One scenario run on one platform: the verdict and what happened when.

    Attributes:
        name: scenario name (``chaos.catalog.SCENARIOS``).
        title: what the harness did, in words.
        outcome: the expectation's outcome (``bitwise``, ``close`` or ``fail``).
        checks, recoveries, world_sizes, useful_s, goodput: from the verdict.
        wall_s: the scenario's wall time.
        t0: its start (wall clock), the zero of the timeline.
        events: what the harness did (``{"time", "kind", "label", ...}``; kind ``fault`` marks a fault).
        timeline: the job's metrics records (start/step/signal/checkpoint/end) for the PNG.
        figures: platform-specific numbers shown as extra columns (e.g. Slurm requeues).
        error: a harness error, if any.
        workdir: where the scenario's logs and job files are.
    """

    name: str
    title: str
    outcome: str = "bitwise"
    passed: bool = False
    checks: list[Check] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)
    useful_s: float = 0.0
    goodput: float = 0.0
    wall_s: float = 0.0
    t0: float = 0.0
    events: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    error: str | None = None
    workdir: str = ""

    def apply(self, v: Verdict) -> "ScenarioResult":
        self.passed, self.checks, self.recoveries = v.passed, v.checks, v.recoveries
        self.world_sizes, self.useful_s, self.goodput = v.world_sizes, v.useful_s, v.goodput
        return self

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("timeline")
        return d


def _fmt(v, nd: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def _faults(r: ScenarioResult) -> list[Recovery]:
    return [x for x in r.recoveries if x.kind != "rejoin"]


def figure(results: dict[str, ScenarioResult], spec: str, attr: str) -> list:
    """Values of ``attr`` for the recoveries a target refers to (``name:rejoin`` = that scenario's rejoin)."""
    vals = []
    for key in spec.split(","):
        key, _, kind = key.partition(":")
        r = results.get(key)
        if r is None:
            continue
        recs = [x for x in r.recoveries if x.kind == "rejoin"] if kind == "rejoin" else _faults(r)[:1]
        vals += [getattr(x, attr) for x in recs if getattr(x, attr) is not None]
    return vals


def targets(interval: int, results: dict[str, ScenarioResult]) -> list[dict]:
    """The TARGETS rows that have figures in ``results`` (keyed by scenario name), worst value each."""
    out = []
    for label, spec, attr, target, op in TARGETS:
        target = interval if target is None else target
        vals = figure(results, spec, attr)
        if not vals:
            continue
        worst = max(vals)
        met = worst <= target if op == "<=" else worst == target
        out.append({"target": label, "value": worst, "values": vals, "limit": f"{op} {target}", "met": met})
    return out


def summary(results: list[ScenarioResult]) -> dict:
    done = [r for r in results if r.outcome != "fail"]
    useful = sum(r.useful_s for r in done)
    wall = sum(r.wall_s for r in done)
    return {
        "passed": sum(r.passed for r in results),
        "total": len(results),
        "useful_step_s": useful,
        "wall_s": wall,
        "goodput": useful / wall if wall else 0.0,
        "all_wall_s": sum(r.wall_s for r in results),
    }


def table(results: list[ScenarioResult], reference_goodput: float | None = None, columns: tuple[str, ...] = ()) -> str:
    """The pass/fail table; ``columns`` names extra per-platform ``figures`` to show (e.g. ``requeues``)."""
    width = max([20] + [len(r.name) + 1 for r in results])
    head = (
        f"{'scenario':<{width}}{'verdict':<8}{'detect s':>9}{'recover s':>10}{'lost':>6}{'restarts':>9}"
        + "".join(f"{c:>{len(c) + 2}}" for c in columns)
        + f"{'worlds':>10}{'goodput':>9}{'wall s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        f = _faults(r)
        first = f[0] if f else None
        rj = [x for x in r.recoveries if x.kind == "rejoin"]
        recover = _fmt(first.recover_s) if first else "-"
        lost = _fmt(first.steps_lost) if first else "-"
        if rj:
            recover += f"/{_fmt(rj[0].recover_s)}"
            lost += f"/{_fmt(rj[0].steps_lost)}"
        restarts = sum(x.restarts for x in r.recoveries)
        lines.append(
            f"{r.name:<{width}}{'PASS' if r.passed else 'FAIL':<8}"
            f"{_fmt(first.detect_s) if first else '-':>9}{recover:>10}{lost:>6}{restarts:>9}"
            + "".join(f"{_fmt(r.figures.get(c)):>{len(c) + 2}}" for c in columns)
            + f"{'>'.join(map(str, r.world_sizes)) or '-':>10}"
            f"{(f'{r.goodput:.0%}' if r.outcome != 'fail' else '-'):>9}{r.wall_s:>8.0f}"
        )
        for c in r.checks:
            if not c.ok:
                lines.append(f"{'':4}x {c.name}: {c.detail}")
    s = summary(results)
    lines.append("-" * len(head))
    ref = f"; uninterrupted reference {reference_goodput:.0%}" if reference_goodput is not None else ""
    lines.append(
        f"{s['passed']}/{s['total']} scenarios passed; goodput of the completing scenarios "
        f"{s['goodput']:.0%} ({s['useful_step_s']:.0f} s useful step time / {s['wall_s']:.0f} s wall{ref})"
    )
    lines.append("(recover/lost of a rejoin shown after a slash; restarts = job attempts started after the faults)")
    return "\n".join(lines)


def breakdown_table(results: list[ScenarioResult]) -> str:
    """Where each scenario's first recovery went, phase by phase (seconds; see training.goodput.analysis.BREAKDOWN)."""
    width = max([20] + [len(r.name) + 1 for r in results])
    cols = [(k, max(len(k), 5) + 1) for k in BREAKDOWN]
    head = f"{'restart breakdown (s)':<{width}}" + "".join(f"{k:>{w}}" for k, w in cols) + f"{'total':>7}"
    lines = [head]
    for r in results:
        f = _faults(r)
        parts = f[0].breakdown if f else None
        if not parts:
            continue
        lines.append(
            f"{r.name:<{width}}" + "".join(f"{_fmt(parts.get(k)):>{w}}" for k, w in cols) + f"{_fmt(f[0].recover_s):>7}"
        )
    if len(lines) == 1:
        return ""
    lines.append(
        "(stop_and_rendezvous: from the notice to the new rank 0's spawn; process_start .. restore: its start-up; "
        "compile: the first step's extra time when compiled; first_step: the rest of it, from the start event)"
    )
    return "\n".join(lines)


def targets_table(rows: list[dict]) -> str:
    out = ["targets (reported, not asserted):"]
    for t in rows:
        out.append(
            f"  {t['target']:<52} {_fmt(t['value']):>6}  (target {t['limit']})  {'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(out)


def write_json(
    path: Path,
    platform: str,
    config: dict,
    results: list[ScenarioResult],
    reference: dict,
    target_rows: list[dict],
    png: Path | None,
) -> None:
    """``report.json``: the platform, its config, the reference run, every scenario, targets and summary."""
    data = {
        "platform": platform,
        "config": config,
        "reference": reference,
        "scenarios": [r.to_json() for r in results],
        "targets": target_rows,
        "summary": summary(results),
        "passed": bool(results) and all(r.passed for r in results),
        "timeline_png": str(png) if png else None,
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def reference_goodput(records_effective: list[dict], wall_s: float) -> float:
    return goodput(records_effective, wall_s)[1]


#: The job's metrics events a scenario's timeline keeps (``ScenarioResult.timeline``).
TIMELINE_EVENTS = ("step", "start", "signal", "checkpoint", "end", "straggler")


def _title(r: ScenarioResult) -> str:
    f = _faults(r)
    txt = f"{r.name}: {'PASS' if r.passed else 'FAIL'}"
    if f and f[0].recover_s is not None:
        txt += (
            f"  |  {f[0].kind}: noticed after {_fmt(f[0].detect_s)} s, training after {f[0].recover_s:.1f} s, "
            f"{f[0].steps_lost} step(s) recomputed"
        )
    elif f:
        txt += f"  |  {len(f)} failure(s), job stopped: {r.figures.get('exit codes', '-')}"
    for x in [x for x in r.recoveries if x.kind == "rejoin"][:1]:
        if x.recover_s is not None:
            txt += f"  |  rejoin: world {x.world_after} after {x.recover_s:.1f} s, {x.steps_lost} recomputed"
        else:
            txt += "  |  rejoin: never back at full size"
    return txt


def track(r: ScenarioResult) -> timeline.Track:
    """The timeline block of one scenario: its records, the harness's events and the recovery figures."""
    return timeline.Track(heading=_title(r), t0=r.t0, records=r.timeline, recoveries=r.recoveries, events=r.events)


def timeline_marks(r: ScenarioResult) -> list[Mark]:
    """What the timeline draws for one scenario (``training.goodput.timeline.timeline_marks``)."""
    return timeline.timeline_marks(track(r))


def timeline_png(path: Path, results: list[ScenarioResult], title: str) -> Timeline:
    """One block per scenario (``training.goodput.timeline.timeline_png``)."""
    return timeline.timeline_png(path, [track(r) for r in results], title)

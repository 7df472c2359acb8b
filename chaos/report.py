"""The chaos report for every platform: a pass/fail table, ``report.json`` and a PNG timeline.

Harnesses turn each scenario run into a :class:`ScenarioResult` (the verdict plus what happened when); this
module prints and saves them the same way whatever the platform.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos.analysis import Recovery, goodput
from chaos.verdict import Check, Verdict

# (label, scenario, which figure, target, comparison) -- reported, never asserted: this machine is shared.
# A target of None means "the checkpoint interval".
TARGETS = [
    ("worker kill -> next step (s)", "worker-kill", "recover_s", 10.0, "<="),
    ("node loss -> next step (s)", "node-loss-rejoin", "recover_s", 15.0, "<="),
    ("rejoin -> next full-size step (s)", "node-loss-rejoin:rejoin", "recover_s", 12.0, "<="),
    ("hang detected (s)", "hang", "detect_s", 30.0, "<="),
    ("steps lost on a termination notice", "preemption", "steps_lost", 0, "=="),
    ("steps lost on SIGKILL (worker, node, first node)", "worker-kill,node-kill,node-loss-rejoin,first-node-kill",
     "steps_lost", None, "<="),
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
    return {"passed": sum(r.passed for r in results), "total": len(results),
            "useful_step_s": useful, "wall_s": wall, "goodput": useful / wall if wall else 0.0,
            "all_wall_s": sum(r.wall_s for r in results)}


def table(results: list[ScenarioResult], reference_goodput: float | None = None,
          columns: tuple[str, ...] = ()) -> str:
    """The pass/fail table; ``columns`` names extra per-platform ``figures`` to show (e.g. ``requeues``)."""
    width = max([20] + [len(r.name) + 1 for r in results])
    head = (f"{'scenario':<{width}}{'verdict':<8}{'detect s':>9}{'recover s':>10}{'lost':>6}{'restarts':>9}"
            + "".join(f"{c:>{len(c) + 2}}" for c in columns) + f"{'worlds':>10}{'goodput':>9}{'wall s':>8}")
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
        lines.append(f"{r.name:<{width}}{'PASS' if r.passed else 'FAIL':<8}"
                     f"{_fmt(first.detect_s) if first else '-':>9}{recover:>10}{lost:>6}{restarts:>9}"
                     + "".join(f"{_fmt(r.figures.get(c)):>{len(c) + 2}}" for c in columns)
                     + f"{'>'.join(map(str, r.world_sizes)) or '-':>10}"
                     f"{(f'{r.goodput:.0%}' if r.outcome != 'fail' else '-'):>9}{r.wall_s:>8.0f}")
        for c in r.checks:
            if not c.ok:
                lines.append(f"{'':4}x {c.name}: {c.detail}")
    s = summary(results)
    lines.append("-" * len(head))
    ref = f"; uninterrupted reference {reference_goodput:.0%}" if reference_goodput is not None else ""
    lines.append(f"{s['passed']}/{s['total']} scenarios passed; goodput of the completing scenarios "
                 f"{s['goodput']:.0%} ({s['useful_step_s']:.0f} s useful step time / {s['wall_s']:.0f} s wall{ref})")
    lines.append("(recover/lost of a rejoin shown after a slash; restarts = job attempts started after the faults)")
    return "\n".join(lines)


def targets_table(rows: list[dict]) -> str:
    out = ["targets (reported, not asserted):"]
    for t in rows:
        out.append(f"  {t['target']:<52} {_fmt(t['value']):>6}  (target {t['limit']})  "
                   f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(out)


def write_json(path: Path, platform: str, config: dict, results: list[ScenarioResult], reference: dict,
               target_rows: list[dict], png: Path | None) -> None:
    """``report.json``: the platform, its config, the reference run, every scenario, targets and summary."""
    data = {"platform": platform, "config": config, "reference": reference,
            "scenarios": [r.to_json() for r in results], "targets": target_rows, "summary": summary(results),
            "passed": bool(results) and all(r.passed for r in results),
            "timeline_png": str(png) if png else None}
    path.write_text(json.dumps(data, indent=1, default=str))


def reference_goodput(records_effective: list[dict], wall_s: float) -> float:
    return goodput(records_effective, wall_s)[1]


def timeline_png(path: Path, results: list[ScenarioResult], title: str) -> Path:
    """One row per scenario: loss (left axis) and world size (right axis) over wall time.

    Each worker-group incarnation is drawn separately, so downtime shows as a gap (world size 0); shaded
    red spans run from a failure to the first step after recovery.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from chaos.analysis import split_attempts

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(13, 2.5 * n + 1.4), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        t0 = r.t0
        eff_ids = _effective_ids(r)
        ax2 = ax.twinx()
        worlds = [1]
        for a in split_attempts(r.timeline):
            kept = [x for x in a.steps if id(x) in eff_ids]
            redo = [x for x in a.steps if id(x) not in eff_ids]
            if kept:
                ax.plot([x["time"] - t0 for x in kept], [x["loss"] for x in kept], "o-", color="tab:blue",
                        ms=3, lw=1.2)
            if redo:
                ax.plot([x["time"] - t0 for x in redo], [x["loss"] for x in redo], "x", color="0.5", ms=6)
            end = a.steps[-1]["time"] if a.steps else a.start["time"]
            w = a.start.get("world_size", 0)
            worlds.append(w)
            ax2.hlines(w, a.start["time"] - t0, end - t0, color="tab:orange", lw=3, alpha=0.8)
            ax.axvline(a.start["time"] - t0, color="tab:green", ls=":", lw=1.2)
        ax2.set_ylim(0, max(worlds) + 1)
        ax2.set_yticks(range(0, max(worlds) + 1))
        ax2.set_ylabel("world size", color="tab:orange")
        ax.set_ylabel("loss", color="tab:blue")
        for e in r.events:
            if e["kind"] == "fault":
                ax.axvline(e["time"] - t0, color="tab:red", lw=1.8)
                ax.annotate(e["label"], (e["time"] - t0, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="tab:red", fontsize=8)
            elif e["kind"] in ("rejoin", "replace", "relaunch", "corrupt"):
                ax.axvline(e["time"] - t0, color="tab:purple", ls="--", lw=1.2)
                ax.annotate(e["kind"], (e["time"] - t0, 0.0), xycoords=("data", "axes fraction"),
                            xytext=(3, 4), textcoords="offset points", color="tab:purple", fontsize=8)
        for x in r.recoveries:
            if x.recover_s is not None:
                ax.axvspan(x.time - t0, x.time - t0 + x.recover_s, color="tab:red", alpha=0.10, lw=0)
                ax.annotate(f"{x.recover_s:.1f} s", (x.time - t0 + x.recover_s / 2, 0.5),
                            xycoords=("data", "axes fraction"), ha="center", color="tab:red", fontsize=8)
        f = _faults(r)
        fig_txt = ""
        if f and f[0].recover_s is not None:
            fig_txt = f"  |  detect {_fmt(f[0].detect_s)} s, recover {f[0].recover_s:.1f} s, lost {f[0].steps_lost} steps"
        elif f:
            fig_txt = f"  |  {len(f)} failures, job stopped: {r.figures.get('exit codes', '-')}"
        ax.set_title(f"{r.name}: {'PASS' if r.passed else 'FAIL'}{fig_txt}", loc="left", fontsize=10)
        last = max([x["time"] for x in r.timeline] + [e["time"] for e in r.events] + [t0 + 1]) - t0
        ax.set_xlim(0, last * 1.08)  # room for the labels of a failure at the very end
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the scenario started")
    handles = [Line2D([], [], color="tab:blue", marker="o", ms=3, label="loss (step kept)"),
               Line2D([], [], color="0.5", marker="x", ls="", label="loss (step recomputed later)"),
               Line2D([], [], color="tab:orange", lw=3, label="world size while training"),
               Line2D([], [], color="tab:red", lw=1.8, label="failure injected"),
               Patch(color="tab:red", alpha=0.15, label="failure -> next step"),
               Line2D([], [], color="tab:green", ls=":", label="workers (re)started"),
               Line2D([], [], color="tab:purple", ls="--", label="node rejoin / replace / relaunch")]
    fig.suptitle(title, fontsize=12)
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=9, frameon=False)
    h = 2.5 * n + 1.4
    fig.tight_layout(rect=(0, 0.9 / h, 1, 1 - 0.45 / h))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _effective_ids(r: ScenarioResult) -> set[int]:
    from chaos.analysis import ChainError, effective_steps, split_attempts
    try:
        return {id(x) for x in effective_steps(split_attempts(r.timeline))}
    except ChainError:
        return set()

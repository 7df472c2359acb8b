"""The chaos report: a pass/fail table on stdout, ``report.json`` and a PNG timeline."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from training.chaos.analysis import Recovery, goodput
from training.chaos.config import ChaosConfig
from training.chaos.scenarios import Reference, ScenarioResult

# (label, scenario, which figure, target, comparison) -- reported, never asserted: this machine is shared.
TARGETS = [
    ("worker kill -> next step (s)", "a", "recover_s", 10.0, "<="),
    ("node loss -> next step (s)", "b", "recover_s", 15.0, "<="),
    ("rejoin -> next full-size step (s)", "b:rejoin", "recover_s", 12.0, "<="),
    ("hang detected (s)", "e", "detect_s", 30.0, "<="),
    ("steps lost on SIGTERM", "d", "steps_lost", 0, "=="),
    ("steps lost on SIGKILL (worker, node, first node)", "a,b,c", "steps_lost", None, "<="),
]


def _fmt(v, nd: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def _faults(r: ScenarioResult) -> list[Recovery]:
    return [x for x in r.recoveries if x.kind != "rejoin"]


def figure(results: dict[str, ScenarioResult], spec: str, attr: str) -> list:
    """Values of ``attr`` for the recoveries a target refers to (``b:rejoin`` = b's rejoin)."""
    vals = []
    for key in spec.split(","):
        key, _, kind = key.partition(":")
        r = results.get(key)
        if r is None:
            continue
        recs = [x for x in r.recoveries if x.kind == "rejoin"] if kind == "rejoin" else _faults(r)[:1]
        vals += [getattr(x, attr) for x in recs if getattr(x, attr) is not None]
    return vals


def targets(cfg: ChaosConfig, results: dict[str, ScenarioResult]) -> list[dict]:
    out = []
    for label, spec, attr, target, op in TARGETS:
        target = cfg.interval if target is None else target
        vals = figure(results, spec, attr)
        if not vals:
            continue
        worst = max(vals)
        met = worst <= target if op == "<=" else worst == target
        out.append({"target": label, "value": worst, "values": vals, "limit": f"{op} {target}", "met": met})
    return out


def summary(results: list[ScenarioResult]) -> dict:
    done = [r for r in results if r.expect != "fail"]
    useful = sum(r.useful_s for r in done)
    wall = sum(r.wall_s for r in done)
    return {"passed": sum(r.passed for r in results), "total": len(results),
            "useful_step_s": useful, "wall_s": wall, "goodput": useful / wall if wall else 0.0,
            "all_wall_s": sum(r.wall_s for r in results)}


def table(cfg: ChaosConfig, results: list[ScenarioResult], ref: Reference) -> str:
    head = (f"{'':2}{'scenario':<20}{'verdict':<8}{'detect s':>9}{'recover s':>10}{'lost':>6}{'restarts':>9}"
            f"{'worlds':>10}{'goodput':>9}{'wall s':>8}")
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
        lines.append(f"{r.key:<2}{r.name:<20}{'PASS' if r.passed else 'FAIL':<8}"
                     f"{_fmt(first.detect_s) if first else '-':>9}{recover:>10}{lost:>6}{restarts:>9}"
                     f"{'>'.join(map(str, r.world_sizes)) or '-':>10}"
                     f"{(f'{r.goodput:.0%}' if r.expect != 'fail' else '-'):>9}{r.wall_s:>8.0f}")
        for c in r.checks:
            if not c.ok:
                lines.append(f"{'':4}x {c.name}: {c.detail}")
    s = summary(results)
    _, ref_gp = goodput(ref.effective, ref.wall_s)
    lines.append("-" * len(head))
    lines.append(f"{s['passed']}/{s['total']} scenarios passed; goodput of the completing scenarios "
                 f"{s['goodput']:.0%} ({s['useful_step_s']:.0f} s useful step time / {s['wall_s']:.0f} s wall; "
                 f"uninterrupted reference {ref_gp:.0%})")
    lines.append("(b: recover/lost shown as node-loss/rejoin; restarts = worker-group starts after the faults)")
    return "\n".join(lines)


def targets_table(rows: list[dict]) -> str:
    out = ["targets (reported, not asserted):"]
    for t in rows:
        out.append(f"  {t['target']:<52} {_fmt(t['value']):>6}  (target {t['limit']})  "
                   f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(out)


def write_json(path: Path, cfg: ChaosConfig, results: list[ScenarioResult], ref: Reference,
               target_rows: list[dict], png: Path | None) -> None:
    _, ref_gp = goodput(ref.effective, ref.wall_s)
    data = {"config": asdict(cfg), "reference": {"key": cfg.reference_key(), "cached": ref.cached,
                                                 "checkpoint": str(ref.final), "wall_s": ref.wall_s,
                                                 "goodput": ref_gp},
            "scenarios": [r.to_json() for r in results], "targets": target_rows, "summary": summary(results),
            "timeline_png": str(png) if png else None}
    path.write_text(json.dumps(data, indent=1, default=str))


def timeline_png(path: Path, results: list[ScenarioResult], title: str) -> Path:
    """One row per scenario: loss (left axis) and world size (right axis) over wall time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(13, 2.6 * n + 0.8), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        steps = [x for x in r.timeline if x.get("event") == "step"]
        eff_ids = _effective_ids(r)
        t0 = r.t0
        kept = [x for x in steps if id(x) in eff_ids]
        redo = [x for x in steps if id(x) not in eff_ids]
        if kept:
            ax.plot([x["time"] - t0 for x in kept], [x["loss"] for x in kept], "o-", color="tab:blue", ms=3,
                    lw=1.2, label="loss (kept)")
        if redo:
            ax.plot([x["time"] - t0 for x in redo], [x["loss"] for x in redo], "x", color="0.55", ms=5,
                    label="loss (recomputed later)")
        ax.set_ylabel("loss", color="tab:blue")
        ax2 = ax.twinx()
        if steps:
            ax2.step([x["time"] - t0 for x in steps], [x["world_size"] for x in steps], where="post",
                     color="tab:orange", lw=2, label="world size")
        ax2.set_ylabel("world size", color="tab:orange")
        ax2.set_ylim(0, max([x["world_size"] for x in steps] + [1]) + 1)
        ax2.yaxis.get_major_locator().set_params(integer=True)
        for x in r.timeline:
            if x.get("event") == "start":
                ax.axvline(x["time"] - t0, color="tab:green", ls=":", lw=1.2)
        for e in r.events:
            if e["kind"] == "fault":
                ax.axvline(e["time"] - t0, color="tab:red", lw=1.8)
                ax.annotate(e["label"], (e["time"] - t0, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="tab:red", fontsize=8)
            elif e["kind"] in ("rejoin", "replace", "relaunch", "corrupt"):
                ax.axvline(e["time"] - t0, color="tab:purple", ls="--", lw=1.2)
                ax.annotate(e["kind"], (e["time"] - t0, 0.0), xycoords=("data", "axes fraction"),
                            xytext=(3, 4), textcoords="offset points", color="tab:purple", fontsize=8)
        f = _faults(r)
        fig_txt = ""
        if f and f[0].recover_s is not None:
            fig_txt = f" | recover {f[0].recover_s:.1f} s, lost {f[0].steps_lost} steps"
        ax.set_title(f"{r.key}. {r.name}: {'PASS' if r.passed else 'FAIL'}{fig_txt}", loc="left", fontsize=10)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the scenario started")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color="tab:blue", marker="o", ms=3, label="loss (kept)"),
               Line2D([], [], color="0.55", marker="x", ls="", label="loss (recomputed later)"),
               Line2D([], [], color="tab:orange", lw=2, label="world size"),
               Line2D([], [], color="tab:red", lw=1.8, label="failure injected"),
               Line2D([], [], color="tab:green", ls=":", label="workers (re)started"),
               Line2D([], [], color="tab:purple", ls="--", label="node rejoin / replace / relaunch")]
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.15 / (2.6 * n + 0.8)))
    fig.suptitle(title, fontsize=12, y=1 - 0.02 / (2.6 * n + 0.8) * 10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / (2.6 * n + 0.8)))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _effective_ids(r: ScenarioResult) -> set[int]:
    from training.chaos.analysis import ChainError, effective_steps, split_attempts
    try:
        return {id(x) for x in effective_steps(split_attempts(r.timeline))}
    except ChainError:
        return set()

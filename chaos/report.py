"""The chaos report for every platform: a pass/fail table, ``report.json`` and a PNG timeline.

Harnesses turn each scenario run into a :class:`ScenarioResult` (the verdict plus what happened when); this
module prints and saves them the same way whatever the platform.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos.analysis import BREAKDOWN, Recovery, goodput
from chaos.verdict import Check, Verdict

# (label, scenario, which figure, target, comparison) -- reported, never asserted: this machine is shared.
# A target of None means the steps a failure may cost: the in-memory snapshot interval where that tier is on,
# else the checkpoint interval.
TARGETS = [
    ("worker kill -> next step (s)", "worker-kill", "recover_s", 10.0, "<="),
    ("node loss -> next step (s)", "node-loss-rejoin", "recover_s", 15.0, "<="),
    ("rejoin -> next full-size step (s)", "node-loss-rejoin:rejoin", "recover_s", 12.0, "<="),
    ("hang detected (s)", "hang", "detect_s", 30.0, "<="),
    ("slow node (a spare waiting) -> the spare's first step (s)", "straggler", "recover_s", 30.0, "<="),
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


def breakdown_table(results: list[ScenarioResult]) -> str:
    """Where each scenario's first recovery went, phase by phase (seconds; see chaos.analysis.BREAKDOWN)."""
    width = max([20] + [len(r.name) + 1 for r in results])
    cols = [(k, max(len(k), 5) + 1) for k in BREAKDOWN]
    head = f"{'restart breakdown (s)':<{width}}" + "".join(f"{k:>{w}}" for k, w in cols) + f"{'total':>7}"
    lines = [head]
    for r in results:
        f = _faults(r)
        parts = f[0].breakdown if f else None
        if not parts:
            continue
        lines.append(f"{r.name:<{width}}" + "".join(f"{_fmt(parts.get(k)):>{w}}" for k, w in cols)
                     + f"{_fmt(f[0].recover_s):>7}")
    if len(lines) == 1:
        return ""
    lines.append("(stop_and_rendezvous: from the notice to the new rank 0's exec; interpreter .. restore: its start-up; "
                 "first_step: start event to the first step's record)")
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


# ------------------------------------------------------------------------------------------ the timeline
# What the timeline draws: ``timeline_marks`` turns one scenario into these marks, ``timeline_png`` draws them.
MARK_KINDS = {
    "failure": "a fault: injected (t) -> noticed (detected) -> first step of a restarted attempt (t_end)",
    "rejoin": "a lost node back (t) -> first step at full world size again (t_end); not a failure",
    "action": "another harness action: relaunch, requeue, replacement node, new hot spare, corrupted checkpoint",
    "signal": "the job logged a signal it received",
    "straggler": "the job named a straggler (label: its rank and work time vs the others' median)",
    "attempt": "a worker group ran from its start (t) to its last record (t_end) at world size value, "
               "resumed from step",
    "checkpoint": "checkpoint of step committed",
    "step": "step computed once and kept (value: its loss)",
    "recomputed": "step computed again after a restart; this copy was kept",
    "discarded": "step computed, then lost: its attempt ended before a checkpoint kept it",
}
#: The job's metrics events a scenario's timeline keeps (``ScenarioResult.timeline``).
TIMELINE_EVENTS = ("step", "start", "signal", "checkpoint", "end", "straggler")
ACTIONS = ("replace", "relaunch", "requeue", "corrupt", "spare")  # harness events drawn as actions (plus fault, rejoin)

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in PNG pixels, origin bottom left


@dataclass(frozen=True)
class Mark:
    """One thing the timeline draws (``MARK_KINDS``); times in seconds since the scenario's ``t0``.

    Attributes:
        kind: a ``MARK_KINDS`` key.
        t: when it happened (a span's start).
        t_end: a span's end (None: a point, or a span that never ended).
        step: the step number (steps, checkpoints, signals) or the step an attempt resumed from.
        value: a step's loss, an attempt's world size, the world size a rejoin grew back to.
        label: text for the picture (a fault's or action's name, a signal's name).
        detected: a failure: when it was noticed.
        lost: a failure or rejoin: steps recomputed because of it.
    """

    kind: str
    t: float
    t_end: float | None = None
    step: int | None = None
    value: float | None = None
    label: str = ""
    detected: float | None = None
    lost: int | None = None


@dataclass
class Timeline:
    """What ``timeline_png`` drew, for checking it without reading pixels.

    Attributes:
        path: the PNG.
        marks: per scenario (in the order given), the marks drawn.
        lanes: per scenario, the PNG boxes of its ``events``, ``steps`` and ``loss`` axes.
        labels: per scenario, the boxes of the texts drawn in its events lane (the only texts inside axes).
        legend: the box of the legend.
    """

    path: Path
    marks: list[list[Mark]]
    lanes: list[dict[str, Box]]
    labels: list[list[Box]]
    legend: Box


def _kept_ids(attempts) -> set[int]:
    """ids of the step records the final weights contain (``analysis.effective_steps``). When the history is
    not one consistent chain, a record counts as kept unless a later attempt resumed from before its step."""
    from chaos.analysis import ChainError, effective_steps
    try:
        return {id(x) for x in effective_steps(attempts)}
    except ChainError:
        return {id(s) for i, a in enumerate(attempts) for s in a.steps
                if not any(b.resumed_from < s["step"] for b in attempts[i + 1:])}


def timeline_marks(r: ScenarioResult) -> list[Mark]:
    """Everything the timeline shows for one scenario (``MARK_KINDS``), in time order: a pure function of the
    job's records (``r.timeline``), the harness's events and the recovery figures."""
    from chaos.analysis import split_attempts
    t0 = r.t0
    attempts = split_attempts(r.timeline)
    kept = _kept_ids(attempts)
    # each attempt's last record (any event), for its span
    last: list[float] = []
    for x in r.timeline:
        if x.get("event") == "start":
            last.append(x["time"])
        elif last:
            last[-1] = max(last[-1], x["time"])
    marks: list[Mark] = []
    done: set[int] = set()  # step numbers computed by earlier attempts
    for a, end in zip(attempts, last):
        marks.append(Mark("attempt", a.start["time"] - t0, end - t0, step=a.resumed_from,
                          value=a.start.get("world_size") or (a.steps[0]["world_size"] if a.steps else None)))
        for s in a.steps:
            kind = ("recomputed" if s["step"] in done else "step") if id(s) in kept else "discarded"
            marks.append(Mark(kind, s["time"] - t0, step=s["step"], value=s.get("loss")))
        done |= {s["step"] for s in a.steps}
        marks += [Mark("signal", x["time"] - t0, step=x.get("step"), label=str(x.get("signal", "signal")))
                  for x in a.signals]
    marks += [Mark("checkpoint", x["time"] - t0, step=x["step"]) for x in r.timeline
              if x.get("event") == "checkpoint" and x.get("committed", True)]
    marks += [Mark("straggler", x["time"] - t0, step=x.get("step"),
                   label=f"straggler: rank {x.get('rank')} x{x.get('ratio')}") for x in r.timeline
              if x.get("event") == "straggler"]
    for x in r.recoveries:
        end = None if x.recover_s is None else x.time + x.recover_s - t0
        if x.kind == "rejoin":
            marks.append(Mark("rejoin", x.time - t0, end, value=x.world_after, label="rejoin", lost=x.steps_lost))
        else:
            marks.append(Mark("failure", x.time - t0, end, label=x.kind, lost=x.steps_lost,
                              detected=None if x.detect_s is None else x.time + x.detect_s - t0))
    covered = {(m.kind, round(m.t, 3)) for m in marks}
    for e in r.events:  # harness events without recovery figures (a harness error, a platform's extra actions)
        kind = {"fault": "failure", "rejoin": "rejoin"}.get(e["kind"], "action" if e["kind"] in ACTIONS else None)
        if kind and (kind, round(e["time"] - t0, 3)) not in covered:
            marks.append(Mark(kind, e["time"] - t0, label=e.get("label") or e["kind"]))
    order = list(MARK_KINDS)
    return sorted(marks, key=lambda m: (m.t, order.index(m.kind), m.step or 0))


def _title(r: ScenarioResult) -> str:
    f = _faults(r)
    txt = f"{r.name}: {'PASS' if r.passed else 'FAIL'}"
    if f and f[0].recover_s is not None:
        txt += (f"  |  {f[0].kind}: noticed after {_fmt(f[0].detect_s)} s, training after {f[0].recover_s:.1f} s, "
                f"{f[0].steps_lost} step(s) recomputed")
    elif f:
        txt += f"  |  {len(f)} failure(s), job stopped: {r.figures.get('exit codes', '-')}"
    for x in [x for x in r.recoveries if x.kind == "rejoin"][:1]:
        if x.recover_s is not None:
            txt += f"  |  rejoin: world {x.world_after} after {x.recover_s:.1f} s, {x.steps_lost} recomputed"
        else:
            txt += "  |  rejoin: never back at full size"
    return txt


def timeline_png(path: Path, results: list[ScenarioResult], title: str) -> Timeline:
    """One block per scenario, three lanes over the same wall-time axis (seconds since the scenario started):

    * events: faults (red: injected -> noticed, dark; noticed -> training again, light), rejoins and other
      harness actions (purple), worker groups at their world size (green full size, olive smaller) and
      committed checkpoints (black diamonds with their step);
    * steps: the step number of every step record, so a restart shows as a drop back to the step it resumed
      from: steps kept (blue), computed again after a restart (orange), lost with their attempt (grey crosses),
      checkpoint commits (black diamonds);
    * loss of the same records.

    Texts sit in the events lane or outside the axes (the legend is below them all); the data lanes carry none.
    Returns what was drawn (:class:`Timeline`), see ``timeline_marks``.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = _Grid(len(results))
    fig = plt.figure(figsize=(grid.width, grid.height), dpi=grid.dpi)
    blocks: list[_Block] = []
    top = grid.h_title
    for r in results:
        blocks.append(_draw_scenario(grid.lanes(fig, top), r))
        top += grid.block + grid.h_gap
    fig.suptitle(title, fontsize=12, x=grid.left / grid.width, ha="left", y=1 - 0.15 / grid.height, va="top")
    legend = fig.legend(handles=_legend_handles(), loc="lower left",
                        bbox_to_anchor=(grid.left / grid.width, 0.1 / grid.height), ncol=3, fontsize=8.5,
                        frameon=False, borderaxespad=0)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for b in blocks:  # a long title shrinks to fit the figure's width
        while b.title.get_window_extent(renderer).x1 > fig.bbox.x1 - 4 and b.title.get_fontsize() > 6:
            b.title.set_fontsize(b.title.get_fontsize() - 0.5)
    labels = [_place_labels(b, renderer) for b in blocks]
    lanes = [{k: _box(ax.get_window_extent(renderer)) for k, ax in b.lanes.items()} for b in blocks]
    out = Timeline(Path(path), [b.marks for b in blocks], lanes, labels, _box(legend.get_window_extent(renderer)))
    fig.savefig(path, dpi=grid.dpi, metadata={"Software": None})
    plt.close(fig)
    return out


_COLORS = {"failure": "tab:red", "rejoin": "tab:purple", "action": "tab:purple", "step": "tab:blue",
           "recomputed": "tab:orange", "discarded": "0.45", "checkpoint": "black", "full": "tab:green",
           "small": "tab:olive", "signal": "darkred", "straggler": "tab:purple"}
_EVENT_ROWS = {"faults": 3, "rejoins, actions": 2, "workers": 1, "checkpoints": 0}  # y of each row, events lane


class _Grid:
    """The timeline's geometry, in inches: a fixed width, a title, one block of three lanes per scenario (a
    header for its title, then events, steps and loss), the legend at the bottom."""

    dpi, width, left, right = 90, 13.0, 1.15, 0.3
    h_title, h_head, h_events, h_steps, h_loss, h_ticks, h_gap, h_legend = 0.5, 0.3, 1.05, 1.35, 0.8, 0.45, 0.3, 1.0

    def __init__(self, scenarios: int):
        self.block = self.h_head + self.h_events + self.h_steps + self.h_loss + self.h_ticks + 2 * 0.06
        self.height = self.h_title + scenarios * self.block + (scenarios - 1) * self.h_gap + self.h_legend

    def axes_at(self, fig, top: float, h: float):
        """Axes across the width, ``h`` high, ``top`` inches below the figure's top."""
        return fig.add_axes(((self.left / self.width), 1 - (top + h) / self.height,
                             1 - (self.left + self.right) / self.width, h / self.height))

    def lanes(self, fig, top: float) -> dict:
        """The events, steps and loss axes of the block that starts ``top`` inches below the figure's top."""
        return {"events": self.axes_at(fig, top + self.h_head, self.h_events),
                "steps": self.axes_at(fig, top + self.h_head + self.h_events + 0.06, self.h_steps),
                "loss": self.axes_at(fig, top + self.h_head + self.h_events + self.h_steps + 0.12, self.h_loss)}


@dataclass
class _Block:
    """One scenario's part of the figure: its marks, its lanes' axes, its title and the texts of its events lane
    (each with the end of the bar it must fit in, or None), placed once the figure is drawn."""

    marks: list[Mark]
    lanes: dict
    title: object
    texts: list[tuple[object, float | None]]


def _draw_scenario(lanes: dict, r: ScenarioResult) -> _Block:
    """Draw ``r`` into its three lanes: the x axis (to the last thing that happened), then events, steps, loss."""
    ev, st, lo = lanes["events"], lanes["steps"], lanes["loss"]
    marks = timeline_marks(r)
    xmax = max([m.t_end or m.t for m in marks] + [e["time"] - r.t0 for e in r.events] + [1.0]) * 1.03
    for ax in (ev, st, lo):
        ax.set_xlim(0, xmax)
        ax.grid(axis="x", alpha=0.3)
    for ax in (ev, st):
        ax.tick_params(labelbottom=False)
    ev.set_ylim(-0.6, 3.85)
    ev.set_yticks(list(_EVENT_ROWS.values()), list(_EVENT_ROWS), fontsize=8)
    ev.tick_params(axis="y", length=0)
    title = ev.set_title(_title(r), loc="left", fontsize=10)
    events = _EventsLane(ev, st, marks, xmax)
    events.draw()
    _draw_steps_and_loss(st, lo, marks)
    for ax in (ev, st, lo):
        ax.tick_params(labelsize=8)
    return _Block(marks, lanes, title, events.texts)


class _EventsLane:
    """The events lane of one scenario: a row each for faults, rejoins and actions, worker groups, checkpoints
    (:data:`_EVENT_ROWS`). Its texts are collected in ``texts`` for :func:`_place_labels`."""

    def __init__(self, ev, st, marks: list[Mark], xmax: float):
        self.ev, self.st, self.marks, self.xmax = ev, st, marks, xmax
        self.texts: list[tuple[object, float | None]] = []
        worlds = [m.value for m in marks if m.kind == "attempt" and m.value]
        self.full = max(worlds) if worlds else None  # the world size drawn as "full"
        self.fails = [m.t for m in marks if m.kind == "failure"]

    def draw(self) -> None:
        drawers = {"failure": self.failure, "rejoin": self.rejoin, "action": self.action, "signal": self.signal,
                   "attempt": self.attempt, "checkpoint": self.checkpoint, "straggler": self.straggler}
        for m in self.marks:
            if m.kind in drawers:
                drawers[m.kind](m)

    def label(self, x: float, y: float, text: str, color: str) -> None:
        """A text at ``x`` above a row, turned to the left near the right edge."""
        near_end = x > 0.8 * self.xmax
        self.texts.append((self.ev.text(x + (-0.004 if near_end else 0.004) * self.xmax, y, text, fontsize=7.5,
                                        color=color, ha="right" if near_end else "left", va="bottom"), None))

    def failure(self, m: Mark) -> None:
        """Injected -> noticed (dark), noticed -> training again (light; hatched up to the next fault or the end
        when it never trained again)."""
        y, c = _EVENT_ROWS["faults"], _COLORS["failure"]
        stop = m.t_end if m.t_end is not None else min([t for t in self.fails if t > m.t] + [self.xmax])
        mid = m.detected if m.detected is not None and m.detected <= stop else m.t
        if mid > m.t:
            self.ev.barh(y, mid - m.t, left=m.t, height=0.4, color=c, alpha=0.9)
        self.ev.barh(y, stop - mid, left=mid, height=0.4, color=c, alpha=0.3,
                     hatch="///" if m.t_end is None else None, edgecolor=c, lw=0)
        self.ev.plot([m.t], [y], marker="|", ms=12, mew=2, color=c)
        self.label(m.t, y + 0.24, m.label + (f" ({m.lost} recomputed)" if m.lost is not None else ""), "darkred")

    def rejoin(self, m: Mark) -> None:
        y = _EVENT_ROWS["rejoins, actions"]
        if m.t_end is not None:
            self.ev.barh(y, m.t_end - m.t, left=m.t, height=0.4, color=_COLORS["rejoin"], alpha=0.3, lw=0)
        self.ev.plot([m.t], [y], marker="^", ms=7, color=_COLORS["rejoin"])
        self.label(m.t, y + 0.24, m.label, _COLORS["rejoin"])

    def action(self, m: Mark) -> None:
        y = _EVENT_ROWS["rejoins, actions"]
        self.ev.plot([m.t], [y], marker="v", ms=6, color=_COLORS["action"], mfc="white")
        self.label(m.t, y + 0.24, m.label, _COLORS["action"])

    def signal(self, m: Mark) -> None:
        self.ev.plot([m.t], [_EVENT_ROWS["workers"]], marker="*", ms=9, color=_COLORS["signal"], mec="white",
                     mew=0.5, zorder=3)

    def straggler(self, m: Mark) -> None:
        """A square on the workers row where the job named a straggler, with its rank and ratio."""
        y = _EVENT_ROWS["workers"]
        self.ev.plot([m.t], [y], marker="s", ms=6, color=_COLORS["straggler"], mec="white", mew=0.5, zorder=3)
        self.label(m.t, y + 0.3, m.label, _COLORS["straggler"])

    def attempt(self, m: Mark) -> None:
        """A worker group's bar (green at full world size, olive smaller), its world size inside if it fits."""
        y, xmax = _EVENT_ROWS["workers"], self.xmax
        c = _COLORS["full"] if m.value == self.full else _COLORS["small"]
        self.ev.barh(y, max(m.t_end - m.t, xmax * 0.002), left=m.t, height=0.5, color=c, alpha=0.75, lw=0)
        self.texts.append((self.ev.text(m.t + 0.004 * xmax, y, f"world {m.value:g}" if m.value else "world ?",
                                        fontsize=7, color="white", va="center", ha="left"), m.t_end))

    def checkpoint(self, m: Mark) -> None:
        """A diamond with its step in the checkpoints row, and one at its step in the steps lane."""
        y = _EVENT_ROWS["checkpoints"]
        self.ev.plot([m.t], [y], "D", ms=5, color=_COLORS["checkpoint"])
        self.texts.append((self.ev.text(m.t + 0.004 * self.xmax, y + 0.05, str(m.step), fontsize=7, va="center",
                                        ha="left"), None))
        self.st.plot([m.t], [m.step], "D", ms=5, color=_COLORS["checkpoint"], zorder=4)


def _draw_steps_and_loss(st, lo, marks: list[Mark]) -> None:
    """The steps and loss lanes: disruptions shaded, each attempt's steps joined by a line (never across two
    attempts), steps kept / recomputed / lost as points."""
    from matplotlib.ticker import MaxNLocator
    for m in marks:
        if m.kind in ("failure", "rejoin") and m.t_end is not None:
            for ax in (st, lo):
                ax.axvspan(m.t, m.t_end, color=_COLORS[m.kind], alpha=0.08, lw=0)
    att = [m for m in marks if m.kind == "attempt"]
    for i, a in enumerate(att):
        stop = att[i + 1].t if i + 1 < len(att) else float("inf")
        mine = [m for m in marks if m.kind in ("step", "recomputed", "discarded") and a.t <= m.t < stop]
        st.plot([a.t], [a.step or 0], marker=">", ms=6, color=_COLORS["full"], zorder=3)
        if mine:  # dotted while starting up at the step it resumed from, then a line through its steps
            xs = [m.t for m in mine]
            st.plot([a.t, xs[0]], [a.step or 0] * 2, color=_COLORS["full"], ls=":", lw=1.2, zorder=1)
            st.plot(xs, [m.step for m in mine], color="0.6", lw=0.9, zorder=1)
            lo.plot(xs, [m.value for m in mine], color="0.6", lw=0.9, zorder=1)
    for kind, style in (("step", dict(marker="o", ms=3.5)),
                        ("recomputed", dict(marker="o", ms=6, mec="black", mew=0.6)),
                        ("discarded", dict(marker="x", ms=6, mew=1.5))):
        pts = [m for m in marks if m.kind == kind]
        if pts:
            st.plot([m.t for m in pts], [m.step for m in pts], ls="", color=_COLORS[kind], zorder=3, **style)
            lo.plot([m.t for m in pts], [m.value for m in pts], ls="", color=_COLORS[kind], zorder=3, **style)
    st.set_ylabel("step", fontsize=9)
    st.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    st.set_ylim(-0.08 * max([m.step or 0 for m in marks] + [1]), None)
    st.grid(axis="y", alpha=0.3)
    lo.set_ylabel("loss", fontsize=9)
    lo.yaxis.set_major_locator(MaxNLocator(nbins=4))
    lo.set_xlabel("seconds since the scenario started", fontsize=8, labelpad=1)


def _legend_handles() -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    c = _COLORS
    return [
        Patch(color=c["failure"], alpha=0.9, label="fault injected -> noticed"),
        Patch(color=c["failure"], alpha=0.3, label="noticed -> training again (hatched: never)"),
        Line2D([], [], marker="*", ls="", color=c["signal"], label="job logged a signal"),
        Line2D([], [], marker="s", ls="", ms=6, color=c["straggler"], label="job named a straggler"),
        Patch(color=c["rejoin"], alpha=0.3, label="node rejoined -> full world size again (not a failure)"),
        Line2D([], [], marker="v", ls="", color=c["action"], mfc="white",
               label="harness: relaunch / requeue / replacement / corruption"),
        Patch(color=c["full"], alpha=0.75, label="worker group at full world size"),
        Patch(color=c["small"], alpha=0.75, label="worker group at a smaller world size"),
        Line2D([], [], marker=">", ls="", color=c["full"], label="(re)start, at the step it resumed from"),
        Line2D([], [], marker="D", ls="", ms=5, color=c["checkpoint"], label="checkpoint committed (step)"),
        Line2D([], [], marker="o", ms=3.5, color=c["step"], ls="", label="step kept"),
        Line2D([], [], marker="o", ms=6, mec="black", mew=0.6, color=c["recomputed"], ls="",
               label="step computed again after a restart (kept)"),
        Line2D([], [], marker="x", ms=6, mew=1.5, color=c["discarded"], ls="",
               label="step lost (its attempt ended before a checkpoint kept it)"),
    ]


def _place_labels(b: _Block, renderer) -> list[Box]:
    """Hide each events-lane text that overlaps one placed before it (left to right) or does not fit in its bar;
    the boxes of those kept."""
    placed: list = []
    for t, bar_end in sorted(b.texts, key=lambda tb: tb[0].get_position()[0]):
        bb = t.get_window_extent(renderer)
        too_wide = bar_end is not None and bb.x1 > b.lanes["events"].transData.transform((bar_end, 0))[0]
        if too_wide or any(bb.overlaps(p) for p in placed):
            t.set_visible(False)
        else:
            placed.append(bb)
    return [_box(p) for p in placed]


def _box(b) -> Box:
    return tuple(float(v) for v in b.extents)

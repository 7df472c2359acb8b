"""The timeline PNG of a job's history: one block per run (a chaos scenario, or a run's ledger), three lanes over
wall time: events (failures, restarts, checkpoints), steps (a restart shows as a drop back), loss.

    track = Track(heading="run: ...", t0=first_record_time, records=metrics_records, recoveries=[...])
    drawn = timeline_png(path, [track], "title")    # -> Timeline: the marks and boxes drawn, for tests

What is drawn is a pure function of the job's ``metrics.jsonl`` records, the harness's events (none for an
ordinary run) and the recovery figures (:mod:`training.goodput.analysis`): :func:`timeline_marks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training.goodput.analysis import ChainError, Recovery, effective_steps, split_attempts

# What the timeline draws: ``timeline_marks`` turns one track into these marks, ``timeline_png`` draws them.
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
ACTIONS = ("replace", "relaunch", "requeue", "corrupt", "spare")  # harness events drawn as actions (plus fault, rejoin)

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in PNG pixels, origin bottom left


@dataclass
class Track:
    """One block of the timeline: a job's records and what happened to it.

    Attributes:
        heading: the block's title (what happened, in words).
        t0: the zero of its time axis (wall clock), e.g. when the scenario or run started.
        records: the job's ``metrics.jsonl`` records (``analysis.parse_records``).
        recoveries: the figures of each disruption (``analysis.recovery``).
        events: what a harness did (``{"time", "kind", "label"}``; kind ``fault``, ``rejoin`` or one of
            :data:`ACTIONS`); none for an ordinary run.
    """

    heading: str
    t0: float
    records: list[dict]
    recoveries: list[Recovery] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Mark:
    """One thing the timeline draws (``MARK_KINDS``); times in seconds since the track's ``t0``.

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
        marks: per track (in the order given), the marks drawn.
        lanes: per track, the PNG boxes of its ``events``, ``steps`` and ``loss`` axes.
        labels: per track, the boxes of the texts drawn in its events lane (the only texts inside axes).
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
    try:
        return {id(x) for x in effective_steps(attempts)}
    except ChainError:
        return {
            id(s)
            for i, a in enumerate(attempts)
            for s in a.steps
            if not any(b.resumed_from < s["step"] for b in attempts[i + 1 :])
        }


def timeline_marks(r: Track) -> list[Mark]:
    """Everything the timeline shows for one track (``MARK_KINDS``), in time order: a pure function of the
    job's records (``r.records``), the harness's events and the recovery figures."""
    t0 = r.t0
    attempts = split_attempts(r.records)
    kept = _kept_ids(attempts)
    # each attempt's last record (any event), for its span
    last: list[float] = []
    for x in r.records:
        if x.get("event") == "start":
            last.append(x["time"])
        elif last:
            last[-1] = max(last[-1], x["time"])
    marks: list[Mark] = []
    done: set[int] = set()  # step numbers computed by earlier attempts
    for a, end in zip(attempts, last):
        marks.append(
            Mark(
                "attempt",
                a.start["time"] - t0,
                end - t0,
                step=a.resumed_from,
                value=a.start.get("world_size") or (a.steps[0]["world_size"] if a.steps else None),
            )
        )
        for s in a.steps:
            kind = ("recomputed" if s["step"] in done else "step") if id(s) in kept else "discarded"
            marks.append(Mark(kind, s["time"] - t0, step=s["step"], value=s.get("loss")))
        done |= {s["step"] for s in a.steps}
        marks += [
            Mark("signal", x["time"] - t0, step=x.get("step"), label=str(x.get("signal", "signal"))) for x in a.signals
        ]
    marks += [
        Mark("checkpoint", x["time"] - t0, step=x["step"])
        for x in r.records
        if x.get("event") == "checkpoint" and x.get("committed", True)
    ]
    marks += [
        Mark(
            "straggler", x["time"] - t0, step=x.get("step"), label=f"straggler: rank {x.get('rank')} x{x.get('ratio')}"
        )
        for x in r.records
        if x.get("event") == "straggler"
    ]
    for x in r.recoveries:
        end = None if x.recover_s is None else x.time + x.recover_s - t0
        if x.kind == "rejoin":
            marks.append(Mark("rejoin", x.time - t0, end, value=x.world_after, label="rejoin", lost=x.steps_lost))
        else:
            marks.append(
                Mark(
                    "failure",
                    x.time - t0,
                    end,
                    label=x.kind,
                    lost=x.steps_lost,
                    detected=None if x.detect_s is None else x.time + x.detect_s - t0,
                )
            )
    covered = {(m.kind, round(m.t, 3)) for m in marks}
    for e in r.events:  # harness events without recovery figures (a harness error, a platform's extra actions)
        kind = {"fault": "failure", "rejoin": "rejoin"}.get(e["kind"], "action" if e["kind"] in ACTIONS else None)
        if kind and (kind, round(e["time"] - t0, 3)) not in covered:
            marks.append(Mark(kind, e["time"] - t0, label=e.get("label") or e["kind"]))
    order = list(MARK_KINDS)
    return sorted(marks, key=lambda m: (m.t, order.index(m.kind), m.step or 0))


def timeline_png(path: Path, tracks: list[Track], title: str) -> Timeline:
    """One block per track, three lanes over the same wall-time axis (seconds since its ``t0``):

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

    grid = _Grid(len(tracks))
    fig = plt.figure(figsize=(grid.width, grid.height), dpi=grid.dpi)
    blocks: list[_Block] = []
    top = grid.h_title
    for r in tracks:
        blocks.append(_draw_track(grid.lanes(fig, top), r))
        top += grid.block + grid.h_gap
    fig.suptitle(title, fontsize=12, x=grid.left / grid.width, ha="left", y=1 - 0.15 / grid.height, va="top")
    legend = fig.legend(
        handles=_legend_handles(),
        loc="lower left",
        bbox_to_anchor=(grid.left / grid.width, 0.1 / grid.height),
        ncol=3,
        fontsize=8.5,
        frameon=False,
        borderaxespad=0,
    )
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


_COLORS = {
    "failure": "tab:red",
    "rejoin": "tab:purple",
    "action": "tab:purple",
    "step": "tab:blue",
    "recomputed": "tab:orange",
    "discarded": "0.45",
    "checkpoint": "black",
    "full": "tab:green",
    "small": "tab:olive",
    "signal": "darkred",
    "straggler": "tab:purple",
}
_EVENT_ROWS = {"faults": 3, "rejoins, actions": 2, "workers": 1, "checkpoints": 0}  # y of each row, events lane


class _Grid:
    """The timeline's geometry, in inches: a fixed width, a title, one block of three lanes per track (a
    header for its title, then events, steps and loss), the legend at the bottom."""

    dpi, width, left, right = 90, 13.0, 1.15, 0.3
    h_title, h_head, h_events, h_steps, h_loss, h_ticks, h_gap, h_legend = 0.5, 0.3, 1.05, 1.35, 0.8, 0.45, 0.3, 1.0

    def __init__(self, tracks: int):
        self.block = self.h_head + self.h_events + self.h_steps + self.h_loss + self.h_ticks + 2 * 0.06
        self.height = self.h_title + tracks * self.block + (tracks - 1) * self.h_gap + self.h_legend

    def axes_at(self, fig, top: float, h: float):
        """Axes across the width, ``h`` high, ``top`` inches below the figure's top."""
        return fig.add_axes(
            (
                (self.left / self.width),
                1 - (top + h) / self.height,
                1 - (self.left + self.right) / self.width,
                h / self.height,
            )
        )

    def lanes(self, fig, top: float) -> dict:
        """The events, steps and loss axes of the block that starts ``top`` inches below the figure's top."""
        return {
            "events": self.axes_at(fig, top + self.h_head, self.h_events),
            "steps": self.axes_at(fig, top + self.h_head + self.h_events + 0.06, self.h_steps),
            "loss": self.axes_at(fig, top + self.h_head + self.h_events + self.h_steps + 0.12, self.h_loss),
        }


@dataclass
class _Block:
    """One track's part of the figure: its marks, its lanes' axes, its title and the texts of its events lane
    (each with the end of the bar it must fit in, or None), placed once the figure is drawn."""

    marks: list[Mark]
    lanes: dict
    title: object
    texts: list[tuple[object, float | None]]


def _draw_track(lanes: dict, r: Track) -> _Block:
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
    title = ev.set_title(r.heading, loc="left", fontsize=10)
    events = _EventsLane(ev, st, marks, xmax)
    events.draw()
    _draw_steps_and_loss(st, lo, marks)
    for ax in (ev, st, lo):
        ax.tick_params(labelsize=8)
    return _Block(marks, lanes, title, events.texts)


class _EventsLane:
    """The events lane of one track: a row each for faults, rejoins and actions, worker groups, checkpoints
    (:data:`_EVENT_ROWS`). Its texts are collected in ``texts`` for :func:`_place_labels`."""

    def __init__(self, ev, st, marks: list[Mark], xmax: float):
        self.ev, self.st, self.marks, self.xmax = ev, st, marks, xmax
        self.texts: list[tuple[object, float | None]] = []
        worlds = [m.value for m in marks if m.kind == "attempt" and m.value]
        self.full = max(worlds) if worlds else None  # the world size drawn as "full"
        self.fails = [m.t for m in marks if m.kind == "failure"]

    def draw(self) -> None:
        drawers = {
            "failure": self.failure,
            "rejoin": self.rejoin,
            "action": self.action,
            "signal": self.signal,
            "attempt": self.attempt,
            "checkpoint": self.checkpoint,
            "straggler": self.straggler,
        }
        for m in self.marks:
            if m.kind in drawers:
                drawers[m.kind](m)

    def label(self, x: float, y: float, text: str, color: str) -> None:
        """A text at ``x`` above a row, turned to the left near the right edge."""
        near_end = x > 0.8 * self.xmax
        self.texts.append(
            (
                self.ev.text(
                    x + (-0.004 if near_end else 0.004) * self.xmax,
                    y,
                    text,
                    fontsize=7.5,
                    color=color,
                    ha="right" if near_end else "left",
                    va="bottom",
                ),
                None,
            )
        )

    def failure(self, m: Mark) -> None:
        """Injected -> noticed (dark), noticed -> training again (light; hatched up to the next fault or the end
        when it never trained again)."""
        y, c = _EVENT_ROWS["faults"], _COLORS["failure"]
        stop = m.t_end if m.t_end is not None else min([t for t in self.fails if t > m.t] + [self.xmax])
        mid = m.detected if m.detected is not None and m.detected <= stop else m.t
        if mid > m.t:
            self.ev.barh(y, mid - m.t, left=m.t, height=0.4, color=c, alpha=0.9)
        self.ev.barh(
            y,
            stop - mid,
            left=mid,
            height=0.4,
            color=c,
            alpha=0.3,
            hatch="///" if m.t_end is None else None,
            edgecolor=c,
            lw=0,
        )
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
        self.ev.plot(
            [m.t], [_EVENT_ROWS["workers"]], marker="*", ms=9, color=_COLORS["signal"], mec="white", mew=0.5, zorder=3
        )

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
        self.texts.append(
            (
                self.ev.text(
                    m.t + 0.004 * xmax,
                    y,
                    f"world {m.value:g}" if m.value else "world ?",
                    fontsize=7,
                    color="white",
                    va="center",
                    ha="left",
                ),
                m.t_end,
            )
        )

    def checkpoint(self, m: Mark) -> None:
        """A diamond with its step in the checkpoints row, and one at its step in the steps lane."""
        y = _EVENT_ROWS["checkpoints"]
        self.ev.plot([m.t], [y], "D", ms=5, color=_COLORS["checkpoint"])
        self.texts.append(
            (self.ev.text(m.t + 0.004 * self.xmax, y + 0.05, str(m.step), fontsize=7, va="center", ha="left"), None)
        )
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
    for kind, style in (
        ("step", dict(marker="o", ms=3.5)),
        ("recomputed", dict(marker="o", ms=6, mec="black", mew=0.6)),
        ("discarded", dict(marker="x", ms=6, mew=1.5)),
    ):
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
    lo.set_xlabel("seconds since the start", fontsize=8, labelpad=1)


def _legend_handles() -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    c = _COLORS
    return [
        Patch(color=c["failure"], alpha=0.9, label="failure (fault injected) -> noticed"),
        Patch(color=c["failure"], alpha=0.3, label="noticed -> training again (hatched: never)"),
        Line2D([], [], marker="*", ls="", color=c["signal"], label="job logged a signal"),
        Line2D([], [], marker="s", ls="", ms=6, color=c["straggler"], label="job named a straggler"),
        Patch(color=c["rejoin"], alpha=0.3, label="node rejoined -> full world size again (not a failure)"),
        Line2D(
            [],
            [],
            marker="v",
            ls="",
            color=c["action"],
            mfc="white",
            label="harness: relaunch / requeue / replacement / corruption",
        ),
        Patch(color=c["full"], alpha=0.75, label="worker group at full world size"),
        Patch(color=c["small"], alpha=0.75, label="worker group at a smaller world size"),
        Line2D([], [], marker=">", ls="", color=c["full"], label="(re)start, at the step it resumed from"),
        Line2D([], [], marker="D", ls="", ms=5, color=c["checkpoint"], label="checkpoint committed (step)"),
        Line2D([], [], marker="o", ms=3.5, color=c["step"], ls="", label="step kept"),
        Line2D(
            [],
            [],
            marker="o",
            ms=6,
            mec="black",
            mew=0.6,
            color=c["recomputed"],
            ls="",
            label="step computed again after a restart (kept)",
        ),
        Line2D(
            [],
            [],
            marker="x",
            ms=6,
            mew=1.5,
            color=c["discarded"],
            ls="",
            label="step lost (its attempt ended before a checkpoint kept it)",
        ),
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

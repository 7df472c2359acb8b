"""The goodput ledger of one run directory: what each failure cost, phase by phase, and the run's goodput.

    ledger = read_ledger("runs/debug")         # LedgerError (one line) for a directory that is not a run's
    print(ledger_text(ledger)); ledger.to_json()

It reads what every run writes (``metrics.jsonl``, ``config.toml``) and, where there is one, the agents'
timestamped log (``<epoch seconds> <line>`` per line, as the chaos harnesses write them; ``agent.log`` in the run
directory or ``--agent-log``), and computes everything with the chaos core's arithmetic
(:mod:`training.goodput.analysis`), so a chaos scenario and an ordinary run are measured the same way. Lines of
``metrics.jsonl`` that are not records (damaged, or a field of the wrong type: ``analysis.scan_records``) are left
out of the figures: ``Ledger.skipped`` holds them, :func:`skipped_warning` says so in one line.

What an ordinary run's records can say, and so what the ledger calls what:

* a **failure** is an attempt that ended without a clean ``end`` record (killed: none; ``crashed`` or ``error``)
  and was followed by another attempt, or one that was stopped by a signal and restarted by its agent (a
  membership change). A relaunch after a clean stop (finished, or a signal with the agent exiting: Ctrl-C, a
  preemption) starts a new **session**: the time between sessions is not the run's wall time.
* a failure **recovered in place** (``failover.in_place``) starts no attempt: rank 0's ``in_place`` record after a
  lost peer is its row (:func:`in_place_failures`: start-up 0, the agreement and new group in stop+rendezvous, the
  rest of the recovery in restore); a joiner let in at a step boundary is no failure.
* its **time** is the interrupted attempt's last record (its last sign of life; a fault injected after a step
  is within milliseconds of it). The job's own records cannot say when the fault itself struck.
* **detect**: from the failure to the first notice: an agent log line (``analysis.DETECT_RE``), a signal the job
  logged, or a ``crashed`` end record (a watchdog's verdict). Without any, detect is unknown and
  stop+rendezvous holds it too.
* **stop+rendezvous**: to the spawn of the new rank 0 (its exec for older records); **start-up**: its process start,
  imports, device init, process group, model build and job set-up (each in ``Failure.startup`` and
  ``Ledger.starts``, :data:`training.goodput.analysis.STARTUP_PHASES`); **restore**: loading the state;
  **compile**: the first step's extra time when compiled; **first step**: the rest of the time from its ``start``
  record to its first step's record; **recompute**: from there to the record of the last step done before the
  failure (0 when none was lost).
* a failure's **cost**: from the failure until the job is back at the step it had reached (the first step's own
  compute not counted when nothing was lost). The **uninterrupted estimate** is the goodput of the same useful
  step time over the wall time less those costs.
* **goodput**: the effective steps' step time / the sessions' wall time (first worker's exec to last record).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.goodput import analysis
from training.goodput.analysis import Attempt, ChainError, Recovery, Skipped

METRICS = "metrics.jsonl"
CONFIG = "config.toml"
AGENT_LOG = "agent.log"
PNG = "goodput.png"
#: ``end`` statuses after which a new attempt is a relaunch, not a recovery (when the agent did not restart it).
CLEAN_END = ("finished", "already_finished", "signal")
#: The phases of a failure's cost, in order (seconds; see the module doc).
PHASES = ("detect", "stop_and_rendezvous", "startup", "restore", "compile", "first_step", "recompute")
#: Where a gloo error names its source file ("[/.../gloo/transport/tcp/pair.cc:553] "): not for a reader.
_GLOO_SOURCE = re.compile(r"\[/[^\]]*\]\s*")
#: The worker's own start-up phases that ``startup`` adds up (``analysis.STARTUP_PHASES`` before restore).
WORKER_STARTUP = analysis.STARTUP_PHASES[: analysis.STARTUP_PHASES.index("restore")]


class LedgerError(ValueError):
    """The directory is not a run directory the ledger can read (the message names it and the fix)."""


@dataclass
class Failure:
    """One disruption of the run and what it cost.

    Attributes:
        how: how the interrupted attempt ended, in words.
        time: its last record (epoch seconds).
        step: the last step it completed.
        recovery: the chaos core's figures (``analysis.recovery``): detect_s, recover_s, steps_lost, tier, ...
        phases: seconds per :data:`PHASES` (None: unknown, e.g. detect without an agent log).
        cost_s: from ``time`` until the job was back at ``step`` (None: it never was).
        startup: the recovering worker's start-up by phase (``analysis.STARTUP_PHASES``; None: not recorded).
    """

    how: str
    time: float
    step: int
    recovery: Recovery
    phases: dict[str, float | None]
    cost_s: float | None
    startup: dict[str, float | None] | None = None


@dataclass
class Start:
    """One attempt's start: its rank 0's start-up by phase (``analysis.STARTUP_PHASES``).

    Attributes:
        attempt: its number (1 = the run's first).
        restart_count: its agent's restart count (0: a launch).
        preloaded: a warm worker (forked from a forkserver that had imported torch), None when not recorded.
        compiled: its blocks were compiled.
        phases: seconds per phase.
        total_s: from its spawn to its first step's record (None: no step yet).
        first_step_waits_s: of the first step, the seconds it waited for a storage save and an in-memory snapshot
            (its record's ``ckpt_block_s`` + ``snapshot_block_s``: a first save pins its buffers; None: not
            recorded).
    """

    attempt: int
    restart_count: int
    preloaded: bool | None
    compiled: bool
    phases: dict[str, float | None]
    total_s: float | None
    first_step_waits_s: float | None = None


@dataclass
class Ledger:
    """A run's goodput ledger (see the module doc for the definitions)."""

    run_dir: str
    total_steps: int | None
    step: int
    status: str
    """The newest attempt's: finished, stopped (a signal), crashed, error, or unfinished (no end record: it runs,
    or it was killed)."""
    attempts: int
    world_sizes: list[int]
    failures: list[Failure]
    useful_s: float
    wall_s: float
    goodput: float
    uninterrupted_wall_s: float
    uninterrupted_goodput: float
    t0: float
    starts: list[Start] = field(default_factory=list)
    """Each attempt's start-up by phase, where its start record timed it."""
    records: list[dict] = field(repr=False, default_factory=list)
    skipped: list[Skipped] = field(repr=False, default_factory=list)
    """Lines of the metrics that are not records (damaged, or of the wrong type: ``analysis.scan_records``); the
    figures are of the other lines. :func:`skipped_warning` says so in one line."""
    source: str = "the metrics"
    """Where the records were read from (the metrics file), for messages."""

    @property
    def lost_s(self) -> float:
        return sum(f.cost_s or 0.0 for f in self.failures)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("records")
        d["lost_s"] = round(self.lost_s, 3)
        d["skipped_lines"] = len(d.pop("skipped"))
        d["first_skipped"] = str(self.skipped[0]) if self.skipped else None
        return d


def _kind(a: Attempt) -> str:
    """A failure's short name (the timeline's label): how the interrupted attempt ended."""
    return "killed" if a.end is None else str(a.end.get("status", "?"))


def _how(a: Attempt) -> str:
    """How the interrupted attempt ended, in words (its rank 0's end record, shortened)."""
    if a.end is None:
        return "killed (no end record)"
    detail = " ".join(str(a.end.get("detail") or "").split())
    return _kind(a) + (f": {detail[:100]}" if detail else "")


def _last_sign_of_life(a: Attempt) -> float:
    """The attempt's last record other than its ``end`` (a watchdog's end record is the notice, not the fault)."""
    return max([a.start["time"]] + [s["time"] for s in a.steps] + [s["time"] for s in a.signals])


def _is_failure(prev: Attempt, nxt: Attempt) -> bool:
    """Whether ``nxt`` starting after ``prev`` is a recovery from a disruption (see the module doc)."""
    if prev.end is None or prev.end.get("status") not in CLEAN_END:
        return True  # killed, crashed, error: a failure whether the agent or a person restarted the job
    # a clean stop the agent itself restarted (restart_count grew): a membership change stopped the group
    return prev.end.get("status") == "signal" and (nxt.start.get("restart_count") or 0) > 0


def _phases(
    rec: Recovery, t_fail: float, detected: float | None, attempt: Attempt, first: dict, back: dict | None
) -> dict[str, float | None]:
    """Seconds per PHASE, from the chaos core's breakdown of the recovering attempt."""
    # Without a detection the breakdown is taken as if noticed at once: stop_and_rendezvous then holds detect too.
    parts = analysis.breakdown(t_fail, t_fail if detected is None else detected, attempt.start, attempt.steps) or {}
    out = {
        "detect": None if detected is None else rec.detect_s,
        "stop_and_rendezvous": parts.get("stop_and_rendezvous"),
        "startup": worker_startup_s(parts),
        "restore": parts.get("restore"),
        "compile": parts.get("compile"),
        "first_step": parts.get("first_step"),
        "recompute": None if back is None else round(back["time"] - first["time"], 2),
    }
    return out


def worker_startup_s(phases: dict[str, float | None] | None) -> float | None:
    """The worker's own start-up (:data:`WORKER_STARTUP`) in one figure: the phases it recorded added up (older
    records lack some); None when it recorded none."""
    known = [v for k in WORKER_STARTUP if (v := (phases or {}).get(k)) is not None]
    return round(sum(known), 2) if known else None


def starts(attempts: list[Attempt]) -> list[Start]:
    """The start-up of every attempt whose start record timed it, by phase."""
    out = []
    for n, a in enumerate(attempts, 1):
        phases = analysis.startup_phases(a.start, a.steps)
        if phases is None:
            continue
        su = a.start["startup"]
        began = analysis.startup_began(a.start)
        total = round(a.steps[0]["time"] - began, 2) if a.steps and began else None
        preloaded = su.get("preloaded") if isinstance(su.get("preloaded"), bool) else None  # not a figure: unchecked
        restarts, compiled = a.start.get("restart_count") or 0, su.get("compiled") is True
        out.append(Start(n, restarts, preloaded, compiled, phases, total, _waits(a.steps[0]) if a.steps else None))
    return out


def _seconds(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _waits(step: dict) -> float | None:
    """The step's waits for a storage save and a snapshot (None when its record has neither as a number)."""
    waits = [v for k in ("ckpt_block_s", "snapshot_block_s") if _seconds(v := step.get(k))]
    return round(sum(waits), 2) if waits else None


def failures(attempts: list[Attempt], records: list[dict], detections: list[float]) -> list[Failure]:
    """Every disruption in ``attempts`` with its figures (see the module doc)."""
    found = [
        (i, _last_sign_of_life(attempts[i - 1]))
        for i in range(1, len(attempts))
        if _is_failure(attempts[i - 1], attempts[i])
    ]
    # a crashed attempt's end record is a watchdog's (or the job's own) notice of the failure
    detections = sorted(
        detections + [a.end["time"] for a in attempts if a.end is not None and a.end.get("status") == "crashed"]
    )
    out = []
    for n, (i, t_fail) in enumerate(found):
        prev = attempts[i - 1]
        until = attempts[found[n + 1][0]].start["time"] if n + 1 < len(found) else None
        rec = analysis.recovery(_kind(prev), t_fail, attempts, detections, records, until)
        detected = analysis.first_detection(t_fail, detections, records)
        step = max([s["step"] for a in attempts[:i] for s in a.steps] + [0])
        recovering = next((a for a in attempts[i:] if a.steps and (until is None or a.start["time"] < until)), None)
        if recovering is None:
            out.append(Failure(_how(prev), t_fail, step, rec, dict.fromkeys(PHASES), None, None))
            continue
        first = recovering.steps[0]
        back, cost = _back(rec.steps_lost, recovering.steps, step, t_fail)
        phases = _phases(rec, t_fail, detected, recovering, first, back)
        startup = analysis.startup_phases(recovering.start, recovering.steps)
        out.append(Failure(_how(prev), t_fail, step, rec, phases, cost, startup))
    return out


def _back(steps_lost: int | None, steps: list[dict], step: int, t_fail: float) -> tuple[dict | None, float | None]:
    """The record at which the job was back at ``step`` (its last before the failure at ``t_fail``), among the
    recovery's ``steps``, and the failure's cost: with steps lost, once it recorded that step again (None: still
    recomputing); without, as its first step began."""
    if steps_lost:
        back = next((s for s in steps if s["step"] == step), None)
        return back, None if back is None else round(back["time"] - t_fail, 3)
    first = steps[0]
    return first, round(first["time"] - first.get("step_time_s", 0.0) - t_fail, 3)


def in_place_failures(records: list[dict]) -> list[Failure]:
    """Every failure the job recovered from in place (``failover.in_place``: rank 0's ``in_place`` record after a
    lost peer, and no new attempt; a joiner let in at a step boundary is a membership change, not a failure). Its
    time is the last step record before the recovery began (its ``seconds`` before the record); detect: from there
    to the failed collective; stop+rendezvous: the agreement and the new group (``regroup``); start-up 0 (no process
    started: the survivors kept theirs); restore: the rest of the recovery (group parts, model, state); first step:
    from the record to the first step's; recompute: from there back to the held step."""
    steps = [r for r in records if r.get("event") == "step"]
    out = []
    for rec in records:
        if rec.get("event") != "in_place" or not rec.get("failed"):
            continue
        began = rec["time"] - float(rec.get("seconds") or 0.0)
        t_fail = max([s["time"] for s in steps if s["time"] <= began], default=began)
        failed = " ".join(_GLOO_SOURCE.sub("", str(rec["failed"])).split())  # gloo's "[/path/pair.cc:553] "
        how = f"recovered in place after {failed[:80]}"
        recovery = analysis.recovered_in_place("in place", t_fail, [rec, *steps], None, began)
        after = [s for s in steps if s["time"] > rec["time"]]
        if recovery is None or not after:  # no step since: still recovering, or the job ended there
            recovery = Recovery("in place", t_fail, round(began - t_fail, 3), None, None, 0, None)
            out.append(Failure(how, t_fail, rec["held_step"], recovery, dict.fromkeys(PHASES), None, None))
            continue
        first = after[0]
        back, cost = _back(recovery.steps_lost, after, rec["held_step"], t_fail)
        parts = rec.get("parts") or {}
        phases = {
            "detect": round(began - t_fail, 2),
            "stop_and_rendezvous": parts.get("regroup"),
            "startup": 0.0,
            "restore": round(sum(v for k, v in parts.items() if k != "regroup"), 2),
            "compile": None,
            "first_step": round(first["time"] - rec["time"], 2),
            "recompute": None if back is None else round(back["time"] - first["time"], 2),
        }
        out.append(Failure(how, t_fail, rec["held_step"], recovery, phases, cost, None))
    return out


def sessions(attempts: list[Attempt]) -> list[list[Attempt]]:
    """The attempts grouped by launch: a new session starts at an attempt after a clean stop its agent did not
    restart (a relaunch by a person or a scheduler)."""
    out: list[list[Attempt]] = []
    for i, a in enumerate(attempts):
        if i == 0 or not _is_failure(attempts[i - 1], a):
            out.append([])
        out[-1].append(a)
    return out


def _session_walls(groups: list[list[Attempt]], records: list[dict]) -> list[tuple[float, float]]:
    """(start, end) of each session: its first worker's exec (else its start record) to its last record."""
    starts = [g[0].start["time"] for g in groups] + [float("inf")]
    out = []
    for g, nxt in zip(groups, starts[1:]):
        first = g[0].start
        begin = analysis.startup_began(first) or first["time"]
        out.append((begin, max(r["time"] for r in records if first["time"] <= r["time"] < nxt)))
    return out


def read_agent_log(path: Path) -> list[tuple[float, str]]:
    """``(time, line)`` of a timestamped log (``<epoch seconds> <line>``); lines without a time are skipped."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        try:
            t = float(head)
        except ValueError:
            continue
        if math.isfinite(t):  # 'nan' and 'inf' parse as floats too; they are no time
            out.append((t, rest))
    return out


def _total_steps(run_dir: Path) -> int | None:
    """The run's train.steps from its config.toml (None where it has none that is a positive integer)."""
    try:
        steps = tomllib.loads((run_dir / CONFIG).read_text())["train"]["steps"]
    except (OSError, KeyError, TypeError, ValueError):  # ValueError: TOMLDecodeError, UnicodeDecodeError
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


def read_ledger(run_dir: str | Path, agent_logs: list[Path] = (), metrics: str | Path | None = None) -> Ledger:
    """The ledger of ``run_dir`` (a run's ``job.out_dir``: ``metrics.jsonl`` and ``config.toml``; ``metrics``:
    the run's ``metrics.path`` where it is not ``RUN_DIR/metrics.jsonl``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise LedgerError(
            f"run directory {run_dir} does not exist: give the run's job.out_dir (make train writes runs/<preset>)"
        )
    metrics = Path(metrics) if metrics else run_dir / METRICS
    if not metrics.exists():
        raise LedgerError(
            f"{run_dir} has no {metrics.name if metrics.parent == run_dir else metrics}: it is not a "
            f"run directory, or its run has not started (give the job.out_dir of a run)"
        )
    if not metrics.is_file():  # a directory (or a FIFO, which a read would wait on forever)
        raise LedgerError(
            f"{metrics} is {'a directory' if metrics.is_dir() else 'not a regular file'}, not a "
            f"metrics file: give the job.out_dir of a run, or move {metrics} aside"
        )
    for p in agent_logs:
        if not Path(p).is_file():
            raise LedgerError(f"agent log {p} does not exist: give a file of '<epoch seconds> <line>' lines")
    logs = [p for p in [run_dir / AGENT_LOG, *map(Path, agent_logs)] if p.is_file()]
    try:
        records, skipped = analysis.scan_file(metrics)
        lines = [x for p in logs for x in read_agent_log(p)]
    except OSError as e:  # unreadable (permissions, an I/O error): the reader never fails on what a file holds
        raise LedgerError(
            f"cannot read {e.filename or metrics} ({e.strerror or e}): check its permissions, or "
            f"give the job.out_dir of another run"
        ) from None
    return ledger_from_records(str(run_dir), records, _total_steps(run_dir), lines, what=str(metrics), skipped=skipped)


def ledger_from_records(
    run: str,
    records: list[dict],
    total_steps: int | None = None,
    agent_lines: list[tuple[float, str]] = (),
    what: str = "the metrics",
    skipped: list[Skipped] = (),
) -> Ledger:
    """The ledger of a run's records (``analysis.parse_records``), e.g. read from a pod; ``run`` names it,
    ``what`` where they were read from; ``skipped``: the lines that were not records (``analysis.scan_records``)."""
    attempts = analysis.split_attempts(records)
    if not attempts and skipped:
        raise LedgerError(
            f"{what} has no start record ({_skipped_text(skipped)}): the file is damaged, or not a "
            f"run's metrics; give the job.out_dir of a run"
        )
    if not attempts:
        raise LedgerError(f"{what} has no start record yet: the run has not reached its first step")
    detections = analysis.torchrun_detections(list(agent_lines), after=attempts[0].start["time"])
    try:
        effective = analysis.effective_steps(attempts)
    except ChainError:
        # not one consistent history (records of two runs in one file?): count each step's newest record
        newest = {r["step"]: r for r in records if r.get("event") == "step"}
        effective = [newest[k] for k in sorted(newest)]
    walls = _session_walls(sessions(attempts), records)
    wall = sum(end - begin for begin, end in walls)
    useful, gp = analysis.goodput(effective, wall)
    found = sorted(failures(attempts, records, detections) + in_place_failures(records), key=lambda f: f.time)
    last = attempts[-1]
    status = (
        "unfinished"
        if last.end is None
        else {"signal": "stopped"}.get(last.end.get("status"), last.end.get("status", "?"))
    )
    if status == "already_finished":
        status = "finished"
    lost = sum(f.cost_s or 0.0 for f in found)
    steps = [s["step"] for a in attempts for s in a.steps] + [a.resumed_from for a in attempts]
    return Ledger(
        run_dir=run,
        total_steps=total_steps,
        step=last.last_step if last.steps else max(steps + [0]),
        status=status,
        attempts=len(attempts),
        world_sizes=analysis.world_sizes(records),
        failures=found,
        useful_s=round(useful, 3),
        wall_s=round(wall, 3),
        goodput=gp,
        uninterrupted_wall_s=round(wall - lost, 3),
        uninterrupted_goodput=useful / (wall - lost) if wall - lost > 0 else 0.0,
        t0=walls[0][0],
        starts=starts(attempts),
        records=records,
        skipped=list(skipped),
        source=what,
    )


def _skipped_text(skipped: list[Skipped]) -> str:
    return f"{len(skipped)} line(s) are not records; the first, {skipped[0]}"


def skipped_warning(ledger: Ledger) -> str | None:
    """One line on the lines of the metrics that are not records (None when there are none): how many, the
    first one and why, and what to do."""
    if not ledger.skipped:
        return None
    return (
        f"warning: {ledger.source}: {_skipped_text(ledger.skipped)}; the figures leave them out (a damaged "
        f"or hand-edited file: fix or delete those lines to count them)"
    )


def locate_run(run_dir: str | None, train_args: list[str]) -> tuple[str, str | None]:
    """(run directory, metrics file or None for its metrics.jsonl) from RUN_DIR or the run's training arguments
    (resolved as the job resolves them: ``job.out_dir``, ``metrics.path``)."""
    args = train_args
    if run_dir and args:
        raise LedgerError("give RUN_DIR or the training arguments after --, not both")
    if run_dir:
        return run_dir, None
    if not args:
        raise LedgerError("no run: give RUN_DIR (the run's job.out_dir, e.g. runs/debug) or -- TRAINING_ARGS")
    import contextlib
    import io

    from training.config import ConfigError, load_config

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            cfg = load_config(args)
    except (ConfigError, SystemExit) as e:
        raise LedgerError(f"the training arguments {' '.join(args)!r} do not resolve: {e}") from None
    return cfg.job.out_dir, cfg.metrics.path


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def summary_line(ledger: Ledger) -> str:
    """One line: goodput, what the failures cost, the uninterrupted estimate."""
    n = len(ledger.failures)
    cost = f"{n} failure(s) cost {ledger.lost_s:.1f} s" if n else "no failures"
    return (
        f"[goodput] {ledger.goodput:.0%} of {ledger.wall_s:,.0f} s wall was useful step time; {cost} "
        f"(uninterrupted estimate {ledger.uninterrupted_goodput:.0%}); "
        f"ledger: python -m training.goodput {ledger.run_dir}"
    )


def ledger_text(ledger: Ledger) -> str:
    """The ledger as a screen: the run, one row per failure, the goodput and the uninterrupted estimate."""
    total = f"/{ledger.total_steps}" if ledger.total_steps else ""
    worlds = ">".join(map(str, ledger.world_sizes)) or "-"
    lines = [
        f"goodput ledger of {ledger.run_dir}: step {ledger.step}{total}, {ledger.status}; "
        f"{ledger.attempts} attempt(s), world {worlds}"
    ]
    if ledger.failures:
        cols = [
            ("detect", "detect"),
            ("stop_and_rendezvous", "stop+rdzv"),
            ("startup", "start-up"),
            ("restore", "restore"),
            ("compile", "compile"),
            ("first_step", "1st step"),
            ("recompute", "recompute"),
        ]
        head = (
            f"{'#':>2} {'after step':>10} {'lost':>5} {'tier':>8}"
            + "".join(f"{h:>10}" for _, h in cols)
            + f"{'cost s':>9}  how"
        )
        lines += ["", head, "-" * len(head)]
        for n, f in enumerate(ledger.failures, 1):
            lost = "-" if f.recovery.steps_lost is None else str(f.recovery.steps_lost)
            lines.append(
                f"{n:>2} {f.step:>10} {lost:>5} {f.recovery.tier or '-':>8}"
                + "".join(f"{_fmt(f.phases.get(k)):>10}" for k, _ in cols)
                + f"{_fmt(f.cost_s):>9}  {f.how[:60]}"
            )
        lines.append(
            "(seconds; detect '-': no agent log or notice recorded, stop+rdzv then includes it; "
            "cost: failure -> back at the step it had reached)"
        )
    lines += startup_table(ledger.starts)
    lines += [
        "",
        f"goodput {ledger.goodput:.1%}: {ledger.useful_s:,.1f} s of useful step time in {ledger.wall_s:,.1f} s wall",
        f"uninterrupted estimate {ledger.uninterrupted_goodput:.1%}: the same steps in "
        f"{ledger.uninterrupted_wall_s:,.1f} s without the failures' {ledger.lost_s:,.1f} s",
    ]
    return "\n".join(lines)


#: Column headings of the start-up table, per ``analysis.STARTUP_PHASES``.
_STARTUP_HEADS = {
    "process_start": "process",
    "imports": "imports",
    "device_init": "device",
    "process_group": "pgroup",
    "model_build": "model",
    "job_setup": "setup",
    "restore": "restore",
    "compile": "compile",
    "first_step": "1st step",
}


def start_kind(start: Start) -> str:
    """How the attempt's worker started, in words: launch or restart, warm or cold, compiled."""
    kind = "launch" if start.attempt == 1 or not start.restart_count else "restart"
    warm = {True: "warm", False: "cold", None: "?"}[start.preloaded]
    return f"{kind}, {warm}" + (", compiled" if start.compiled else "")


def startup_table(starts: list[Start]) -> list[str]:
    """Lines of the start-up table: one row per attempt, its rank 0's seconds per phase (none: no rows)."""
    if not starts:
        return []
    heads = [_STARTUP_HEADS[k] for k in analysis.STARTUP_PHASES]
    head = f"{'':<10}" + "".join(f"{h:>9}" for h in heads) + f"{'total':>8}{'waits':>7}  worker"
    lines = ["", "start-up by phase (seconds, rank 0):", head, "-" * len(head)]
    for st in starts:
        lines.append(
            f"{f'attempt {st.attempt}':<10}"  # not a number first: the failure rows above are numbered
            + "".join(f"{_fmt(st.phases.get(k)):>9}" for k in analysis.STARTUP_PHASES)
            + f"{_fmt(st.total_s):>8}{_fmt(st.first_step_waits_s):>7}  {start_kind(st)}"
        )
    lines.append(
        "(process: spawn to main(); pgroup: process group; model: build, shard, allocate; setup: metrics, "
        "data, checkpoint tiers; compile: the first step's extra time; total: spawn to the first step's record; "
        "waits: of the 1st step, waiting for a storage save and a memory snapshot)"
    )
    return lines


def startup_line(start: Start) -> str:
    """One attempt's start-up in one line: its phases over 0.05 s, then the total (for ``make status``)."""
    parts = ", ".join(
        f"{_STARTUP_HEADS[k]} {v:.1f}" for k in analysis.STARTUP_PHASES if (v := start.phases.get(k)) and v >= 0.05
    )
    total = "" if start.total_s is None else f"{start.total_s:.1f} s: "
    return f"{total}{parts or '-'} ({start_kind(start)})"


def timeline_track(ledger: Ledger):
    """The run as one block of the timeline PNG (:mod:`training.goodput.timeline`)."""
    from training.goodput.timeline import Track

    heading = (
        f"{ledger.run_dir}: step {ledger.step}{f'/{ledger.total_steps}' if ledger.total_steps else ''}, "
        f"{ledger.status}  |  {len(ledger.failures)} failure(s) cost {ledger.lost_s:.1f} s  |  goodput "
        f"{ledger.goodput:.0%} (uninterrupted estimate {ledger.uninterrupted_goodput:.0%})"
    )
    return Track(
        heading=heading, t0=ledger.t0, records=ledger.records, recoveries=[f.recovery for f in ledger.failures]
    )

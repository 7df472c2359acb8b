"""Pure arithmetic over a job's ``metrics.jsonl``: the same on every platform, for chaos scenarios and ordinary runs.

The chaos harnesses collect the records (a local file, a Slurm shared directory, FSx through a pod) and the times
at which the platform noticed a failure; the goodput ledger (:mod:`training.goodput.ledger`) reads them from a run
directory. Everything computed from them lives here, once.

Reading them (:func:`scan_records`, :func:`scan_file`; :func:`parse_records` and :func:`load_records` give the
records alone) never fails on what a file holds: a line that is not JSON (bytes that are not UTF-8 read as U+FFFD)
or whose fields the arithmetic reads are missing or of the wrong type (:data:`RECORD_FIELDS`: ``time`` a finite
number, ``step`` an integer, ...) is not a record; it is left out and returned as :class:`Skipped` (line number
and why) for the reader to report.

Definitions (used in the report and docs/failover.md):

* attempt: the records from one ``start`` event to the next (one worker-group incarnation).
* effective step record: the record of a step that the final weights actually contain. A later attempt
  that resumed from step r overrides every record after r, so walking the attempts backwards gives the
  chain; a step recorded twice was recomputed ("lost").
* time to detect: failure -> first sign that the system noticed (platform-specific evidence such as an agent
  logging a failed/restarting worker group, Slurm marking the node DOWN or a JobSet restart; or the job
  logging the signal it received).
* time to recover: failure -> first step completed by an attempt that started after the failure.
* steps lost: last step completed before the recovering attempt started - the step it resumed from.
* goodput: sum of effective steps' step_time_s / wall time of the whole scenario.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

# Agent log lines that mean "a failure was noticed". torchrun logs the first when a worker exits non-zero,
# the others when it decides to restart (failure or a new node waiting) or received a signal; ours when a
# node of the round was lost (its etcd lease expired: training.launch.rendezvous.handler; the older
# '[agent] lost node(s)' line is kept for reports of runs before etcd); the job's own when it named a straggler
# (training.job.stragglers).
DETECT_RE = re.compile(
    r"failed \(exitcode|Worker group (FAILED|UNHEALTHY)|will restart worker group|"
    r"Received Signals?\.SIG|Received SIG\w+ death signal|\[agent\] lost node\(s\)|"
    r"\[rendezvous\] lost node\(s\)|\[straggler\] rank \d+ "
)


@dataclass(frozen=True)
class Skipped:
    """A line of a metrics file that is not a record: its number (1-based, as an editor counts) and why."""

    line: int
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}"


#: Larger integers are no value a record holds (and no float: arithmetic with them would overflow).
_INT_LIMIT = 2**63


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < _INT_LIMIT  # JSON true/false are not numbers


def _is_number(v) -> bool:
    return isinstance(v, float) or _is_int(v)


def _is_finite(v) -> bool:
    return _is_number(v) and math.isfinite(v)


def _startup_ok(v) -> bool:
    """A ``start`` record's ``startup`` (training.job.startup): its epoch times and phase seconds finite or null."""
    return isinstance(v, dict) and all(
        x is None or _is_finite(x) for k, x in v.items() if k in _STARTUP_TIMES or k.endswith("_s")
    )


#: The epoch times a ``startup`` object holds (training.job.startup.StartupClock.summary).
_STARTUP_TIMES = ("began", "spawn_time", "exec_time")


def _restored_ok(v) -> bool:
    return isinstance(v, dict) and (v.get("tier") is None or isinstance(v["tier"], str))


def _parts_ok(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _is_finite(x) for k, x in v.items())


_FINITE, _NUMBER, _INT = (_is_finite, "a finite number"), (_is_number, "a number"), (_is_int, "an integer")
_STR = (lambda v: isinstance(v, str), "a string")


def _or_null(kind):
    return (lambda v: v is None or kind[0](v)), kind[1] + " or null"


#: The fields the arithmetic (here, the ledger, the timeline, tools.status) reads, per event: (check, what it must
#: be, required). A record with one of them missing where required or of another type is not a record: the
#: figures would be wrong or the reader would fail on it. Fields not named here are not looked at.
RECORD_FIELDS: dict[str | None, dict[str, tuple]] = {
    None: {"event": (*_STR, True), "time": (*_FINITE, True)},  # every record
    "start": {
        "resumed_from": (*_or_null(_INT), False),
        "restart_count": (*_or_null(_INT), False),
        "world_size": (*_or_null(_INT), False),
        "startup": (*_or_null((_startup_ok, "an object of finite seconds")), False),
        "restored_from": (*_or_null((_restored_ok, "an object with a string tier")), False),
    },
    "step": {
        "step": (*_INT, True),
        "world_size": (*_INT, True),
        "step_time_s": (*_FINITE, False),
        "tokens_per_s": (*_NUMBER, False),
        "loss": (*_or_null(_NUMBER), False),
        "data_offset": (*_INT, False),
        "snapshot_interval": (*_INT, False),
    },
    "snapshot_interval": {
        "interval": (*_INT, True),
        "mode": (*_STR, False),
        "share": (*_FINITE, False),
        "budget": (*_FINITE, False),
        "detail": (*_STR, False),
    },
    "end": {"status": (*_STR, False), "step": (*_or_null(_INT), False)},
    "signal": {"step": (*_or_null(_INT), False)},
    "checkpoint": {"step": (*_INT, True)},
    "in_place": {
        "held_step": (*_or_null(_INT), True),  # null: a joiner's record (it held no state: held_before says)
        "resumed_from": (*_or_null(_INT), True),  # null: nothing restored (a recovery before any snapshot)
        "seconds": (*_FINITE, False),
        "failed": (*_STR, False),
        "parts": (_parts_ok, "an object of finite seconds", False),
        "restored_from": (*_or_null((_restored_ok, "an object with a string tier")), False),
    },
    "straggler": {"step": (*_or_null(_INT), False)},
}


def _short(v) -> str:
    """The value as the file has it (JSON), cut to fit a line."""
    r = json.dumps(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _field_problem(r: dict, fields: dict[str, tuple]) -> str | None:
    for name, (ok, what, required) in fields.items():
        if name not in r:
            if required:
                return f"{name} is missing"
        elif not ok(r[name]):
            return f"{name} is {_short(r[name])}, not {what}"
    return None


def record_problem(r) -> str | None:
    """Why a decoded JSON value is not a metrics record (see RECORD_FIELDS); None when it is one."""
    if not isinstance(r, dict) or "event" not in r:
        return 'not a JSON object with an "event"'
    # the common fields first: an event that is not a string is never looked up
    return _field_problem(r, RECORD_FIELDS[None]) or _field_problem(r, RECORD_FIELDS.get(r["event"], {}))


def _json_error(e: Exception) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return getattr(e, "msg", None) or str(e)[:60]  # JSONDecodeError's msg leaves out its position: the line says it


def scan_records(text: str) -> tuple[list[dict], list[Skipped]]:
    """Metrics JSONL text -> (records, the lines that are not records). Never raises on what the text holds.

    A line is skipped when it is not JSON, not an object with an ``event``, or a field the arithmetic reads is
    missing or of the wrong type (:data:`RECORD_FIELDS`). A torn last line (no newline after it: a writer killed
    or still writing) is left out without being counted; blank lines are ignored."""
    records: list[dict] = []
    skipped: list[Skipped] = []
    lines = text.split("\n")  # not splitlines(): line numbers as an editor counts them, whatever bytes are in it
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except (ValueError, RecursionError) as e:  # RecursionError: thousands of nested brackets
            if n == len(lines):
                continue  # a torn last line: its writer was killed, or is still writing it
            skipped.append(Skipped(n, f"not JSON ({_json_error(e)})"))
            continue
        why = record_problem(r)
        if why:
            skipped.append(Skipped(n, why))
        else:
            records.append(r)
    return records, skipped


def parse_records(text: str) -> list[dict]:
    """Metrics JSONL text -> event dicts (the records of :func:`scan_records`; lines that are not are left out)."""
    return scan_records(text)[0]


def scan_file(path: str | Path) -> tuple[list[dict], list[Skipped]]:
    """``scan_records`` of a file, read as bytes (what is not UTF-8 becomes U+FFFD: such a line is not a record);
    ([], []) while it does not exist or is not a file. OSError where it cannot be read."""
    p = Path(path)
    if not p.is_file():
        return [], []
    return scan_records(p.read_bytes().decode("utf-8", errors="replace"))


def load_records(path: str | Path) -> list[dict]:
    """The records of a file (:func:`scan_file`; [] while it does not exist)."""
    return scan_file(path)[0]


def torchrun_detections(lines: list[tuple[float, str]], after: float = 0.0) -> list[float]:
    """Times of timestamped agent log lines (``(time, line)``) that say a worker failure was noticed."""
    return [t for t, line in lines if t >= after and DETECT_RE.search(line)]


@dataclass
class Attempt:
    """One worker-group incarnation: its ``start`` record and the step records it logged."""

    start: dict
    steps: list[dict] = field(default_factory=list)
    signals: list[dict] = field(default_factory=list)
    ended: bool = False
    end: dict | None = None
    """Its ``end`` record (status: finished, already_finished, signal, crashed, error), None when it was killed."""

    @property
    def resumed_from(self) -> int:
        return self.start.get("resumed_from") or 0

    @property
    def last_step(self) -> int:
        return self.steps[-1]["step"] if self.steps else self.resumed_from


def split_attempts(records: list[dict]) -> list[Attempt]:
    attempts: list[Attempt] = []
    for r in records:
        ev = r.get("event")
        if ev == "start":
            attempts.append(Attempt(start=r))
        elif not attempts:
            continue  # records before any start cannot be attributed
        elif ev == "step":
            attempts[-1].steps.append(r)
        elif ev == "signal":
            attempts[-1].signals.append(r)
        elif ev == "end":
            attempts[-1].ended, attempts[-1].end = True, r
    return attempts


class ChainError(ValueError):
    """The attempts do not form one consistent history (a resume from a step never completed)."""


def effective_steps(attempts: list[Attempt]) -> list[dict]:
    """Effective step records, in step order (see module doc). Raises ChainError on gaps.

    Walking back from the newest attempt: the attempt that completed step ``upto`` contributes its steps
    ``(resumed_from, upto]`` and hands over to whoever completed ``resumed_from``. An attempt that never
    reached ``upto`` was a dead end (it failed before its work was checkpointed) and contributes nothing.
    """
    chain: list[dict] = []
    upto: int | None = None
    for a in reversed(attempts):
        if upto is None:
            if not a.steps and not a.resumed_from:
                continue
            upto = a.last_step
        if upto == 0:
            break
        mine = {s["step"]: s for s in a.steps if a.resumed_from < s["step"] <= upto}
        if upto not in mine:
            continue
        # the first ten gaps only: a step number far beyond the records must not mean a walk up to it
        missing = list(itertools.islice((k for k in range(a.resumed_from + 1, upto + 1) if k not in mine), 10))
        if missing:
            raise ChainError(
                f"attempt started at {a.start.get('time')} (resumed from {a.resumed_from}) lacks "
                f"steps {missing} needed up to step {upto}"
            )
        chain = [mine[k] for k in range(a.resumed_from + 1, upto + 1)] + chain
        upto = a.resumed_from
    if upto:
        raise ChainError(f"no attempt recorded steps 1..{upto}: the history is incomplete")
    return chain


def exactly_once(effective: list[dict], global_batch: int, total_steps: int) -> list[str]:
    """Problems with sample consumption ([] = every sample in [0, steps x batch) used exactly once).

    Each effective step record logs ``data_offset``, the global sample offset at its start; the step
    consumed ``[data_offset, data_offset + global_batch)``.
    """
    problems = []
    steps = [r["step"] for r in effective]
    if steps != list(range(1, total_steps + 1)):
        missing = sorted(set(range(1, total_steps + 1)) - set(steps))
        problems.append(f"effective steps are not 1..{total_steps}" + (f" (missing {missing[:10]})" if missing else ""))
    covered = 0
    for r in sorted(effective, key=lambda r: r["data_offset"]):
        off = r["data_offset"]
        if off != covered:
            kind = "overlap (samples used twice)" if off < covered else "gap (samples skipped)"
            problems.append(f"step {r['step']}: data_offset {off}, expected {covered}: {kind}")
        covered = max(covered, off + global_batch)
    if covered != total_steps * global_batch:
        problems.append(f"consumed samples end at {covered}, expected {total_steps * global_batch}")
    return problems


@dataclass
class Recovery:
    """Figures for one disruption (a fault, or a node rejoining)."""

    kind: str
    time: float
    detect_s: float | None
    recover_s: float | None
    steps_lost: int | None
    restarts: int
    world_after: int | None
    tier: str | None = None
    """Where the recovering attempt's state came from: memory, peer (a replica), storage (None: fresh)."""
    breakdown: dict[str, float | None] | None = None
    """Where recover_s went (seconds, in order; see BREAKDOWN): None when the attempt did not time its start-up."""


#: A worker's start-up, in order: the phases its ``start`` event's ``startup`` holds (training.job.startup.PHASES),
#: then the extra time of its first step that compiling took (0 when not compiled) and the rest of that step.
STARTUP_PHASES = (
    "process_start",
    "imports",
    "device_init",
    "process_group",
    "model_build",
    "job_setup",
    "restore",
    "compile",
    "first_step",
)
#: Records of workers from before the phases were split: their names for the same stretches.
_LEGACY_PHASES = {"process_start": "interpreter", "model_build": "build"}
#: Steps after the first that stand for a steady step (their median), against which the first one's compile shows.
STEADY_STEPS = 3

#: The phases of a restart, in order: noticed; the agents stopped the old workers and formed a new rendezvous
#: round until the new rank 0 was spawned; that worker's start-up (:data:`STARTUP_PHASES`).
BREAKDOWN = ("notice", "stop_and_rendezvous", *STARTUP_PHASES)


def startup_began(start: dict) -> float | None:
    """When the worker of a ``start`` record began (its agent's spawn, else its exec), None if it did not say."""
    su = start.get("startup") or {}
    return su.get("began") or su.get("exec_time")


def startup_phases(start: dict, steps: list[dict], until: dict | None = None) -> dict[str, float | None] | None:
    """Seconds per :data:`STARTUP_PHASES` of the attempt whose ``start`` record and step records are given
    (None when the start record carries no ``startup``). ``compile``: the first step's ``step_time_s`` less the
    median of the next :data:`STEADY_STEPS` steps' (0 when not compiled; None until a later step is recorded);
    ``first_step``: from the start record to ``until`` (default the first step record) less ``compile``. A phase
    the record lacks is None."""
    su = start.get("startup")
    if not su:
        return None
    out: dict[str, float | None] = {}
    for k in STARTUP_PHASES[:-2]:
        v = su.get(f"{k}_s")
        out[k] = su.get(f"{_LEGACY_PHASES[k]}_s") if v is None and k in _LEGACY_PHASES else v
    first = until or (steps[0] if steps else None)
    compile_s = None
    if steps and su.get("compiled") is not True:
        compile_s = 0.0
    elif steps and "step_time_s" in steps[0]:
        steady = sorted(s["step_time_s"] for s in steps[1 : 1 + STEADY_STEPS] if "step_time_s" in s)
        if steady:
            compile_s = max(0.0, steps[0]["step_time_s"] - steady[len(steady) // 2])
    out["compile"] = compile_s
    out["first_step"] = None if first is None else first["time"] - start["time"] - (compile_s or 0.0)
    return {k: None if v is None else round(v, 2) for k, v in out.items()}


def breakdown(t_fail: float, detected: float | None, start: dict, steps: list[dict], until: dict | None = None):
    """Seconds per phase of :data:`BREAKDOWN` for an attempt whose ``start`` event carries ``startup`` (None
    otherwise, or without a detection): see :func:`startup_phases` for ``steps`` and ``until``."""
    began = startup_began(start)
    phases = startup_phases(start, steps, until)
    if detected is None or not began or phases is None:
        return None
    out = {"notice": round(detected - t_fail, 2), "stop_and_rendezvous": round(began - detected, 2)}
    return {**out, **phases}


def first_detection(t_fail: float, detections: list[float], records: list[dict]) -> float | None:
    """Earliest time at or after ``t_fail`` the platform noticed a failure or the job logged a signal."""
    cands = [t for t in detections if t >= t_fail]
    cands += [r["time"] for r in records if r.get("event") == "signal" and r["time"] >= t_fail]
    return min(cands) if cands else None


def recovery(
    kind: str,
    t_fail: float,
    attempts: list[Attempt],
    detections: list[float],
    records: list[dict],
    until: float | None = None,
    *,
    want_world: int | None = None,
    detect: bool = True,
) -> Recovery:
    """Figures for a disruption at ``t_fail`` (attempts starting before ``until`` count as its restarts).

    ``detections``: times at which the platform noticed a failure (see ``first_detection``).
    ``want_world``: the disruption is over only at a step with this world size (a rejoin).
    """
    after = [a for a in attempts if a.start["time"] >= t_fail and (until is None or a.start["time"] < until)]
    rec_step = None
    for a in after:
        ok = [s for s in a.steps if want_world is None or s["world_size"] == want_world]
        if ok:
            rec_step, rec_attempt = ok[0], a
            break
    steps_lost = None
    if rec_step is not None:
        done_before = [s["step"] for b in attempts if b.start["time"] < rec_attempt.start["time"] for s in b.steps]
        steps_lost = max(0, (max(done_before) if done_before else 0) - rec_attempt.resumed_from)
    det = first_detection(t_fail, detections, records) if detect else None
    if rec_step is None and want_world is None:
        in_place = recovered_in_place(kind, t_fail, records, until, det)
        if in_place is not None:
            return in_place
    parts = None if rec_step is None else breakdown(t_fail, det, rec_attempt.start, rec_attempt.steps, rec_step)
    return Recovery(
        kind=kind,
        time=t_fail,
        detect_s=None if det is None else det - t_fail,
        breakdown=parts,
        recover_s=None if rec_step is None else rec_step["time"] - t_fail,
        steps_lost=steps_lost,
        restarts=len(after),
        world_after=None if rec_step is None else rec_step["world_size"],
        tier=None if rec_step is None else (rec_attempt.start.get("restored_from") or {}).get("tier"),
    )


def held_before(rec: dict, records: list[dict], t_fail: float) -> int:
    """The step the job held when it failed, for an ``in_place`` record: the survivors' ``held_step``; for a
    joiner's (rank 0 replaced: ``held_step`` null, it held nothing) the last step recorded before ``t_fail``, or the
    step the survivors agreed on if that is newer (the lost rank 0 wrote the records: a step the survivors finished
    after it died has none)."""
    if rec.get("held_step") is not None:
        return rec["held_step"]
    recorded = max((r["step"] for r in records if r.get("event") == "step" and r["time"] < t_fail), default=0)
    agreed = rec.get("agreed_step")
    return max(recorded, agreed) if isinstance(agreed, int) else recorded


def recovered_in_place(
    kind: str, t_fail: float, records: list[dict], until: float | None, det: float | None
) -> Recovery | None:
    """The figures of a disruption the job recovered from in place (``failover.in_place``: no new attempt, an
    ``in_place`` record of rank 0 after ``t_fail`` and before ``until``): recovered at the first step after it,
    ``held_step - resumed_from`` steps recomputed, the state's tier; None when there is no such record."""
    rec = next(
        (
            r
            for r in records
            if r.get("event") == "in_place" and r["time"] >= t_fail and (until is None or r["time"] < until)
        ),
        None,
    )
    step = rec and next((r for r in records if r.get("event") == "step" and r["time"] > rec["time"]), None)
    if rec is None or step is None:
        return None
    held = held_before(rec, records, t_fail)
    return Recovery(
        kind=kind,
        time=t_fail,
        detect_s=None if det is None else det - t_fail,
        breakdown=None,
        recover_s=step["time"] - t_fail,
        steps_lost=max(0, held - (rec["resumed_from"] or 0)),
        restarts=0,
        world_after=step["world_size"],
        tier=(rec.get("restored_from") or {}).get("tier"),
    )


def goodput(effective: list[dict], wall_s: float) -> tuple[float, float]:
    """(useful step seconds, useful / wall)."""
    useful = sum(r.get("step_time_s", 0.0) for r in effective)
    return useful, (useful / wall_s if wall_s > 0 else 0.0)


def max_loss_diff(effective: list[dict], reference: list[dict]) -> float | None:
    """Largest |loss - reference loss| over common steps (None when nothing to compare)."""
    ref = {r["step"]: r["loss"] for r in reference}
    diffs = [abs(r["loss"] - ref[r["step"]]) for r in effective if r["step"] in ref]
    return max(diffs) if diffs else None


def world_sizes(records: list[dict]) -> list[int]:
    """The sequence of world sizes the job's steps ran at (consecutive repeats collapsed)."""
    out: list[int] = []
    for r in records:
        if r.get("event") == "step" and (not out or out[-1] != r["world_size"]):
            out.append(r["world_size"])
    return out

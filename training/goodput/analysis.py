"""Pure arithmetic over a job's ``metrics.jsonl``: the same on every platform, for chaos scenarios and ordinary runs.

The chaos harnesses collect the records (a local file, a Slurm shared directory, FSx through a pod) and the times
at which the platform noticed a failure; the goodput ledger (:mod:`training.goodput.ledger`) reads them from a run
directory. Everything computed from them lives here, once.

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

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# Agent log lines that mean "a failure was noticed". torchrun logs the first when a worker exits non-zero,
# the others when it decides to restart (failure or a new node waiting) or received a signal; ours when a
# node of the round was lost (its etcd lease expired: training.launch.rendezvous.handler; the older
# '[agent] lost node(s)' line is kept for reports of runs before etcd); the job's own when it named a straggler
# (training.job.stragglers).
DETECT_RE = re.compile(r"failed \(exitcode|Worker group (FAILED|UNHEALTHY)|will restart worker group|"
                       r"Received Signals?\.SIG|Received SIG\w+ death signal|\[agent\] lost node\(s\)|"
                       r"\[rendezvous\] lost node\(s\)|\[straggler\] rank \d+ ")


def parse_records(text: str) -> list[dict]:
    """Metrics JSONL text -> event dicts (a torn last line from a killed or still-writing writer is ignored)."""
    out = []
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and "event" in r:
            out.append(r)
    return out


def load_records(path: str | Path) -> list[dict]:
    """``parse_records`` of a file ([] while it does not exist)."""
    p = Path(path)
    return parse_records(p.read_text()) if p.exists() else []


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
        missing = [k for k in range(a.resumed_from + 1, upto + 1) if k not in mine]
        if missing:
            raise ChainError(f"attempt started at {a.start.get('time')} (resumed from {a.resumed_from}) lacks "
                             f"steps {missing[:10]} needed up to step {upto}")
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


#: The phases of a restart, in order: noticed; the agents stopped the old workers and formed a new rendezvous
#: round until the new rank 0 was exec'd; that worker's start-up (training.job.startup); its first step.
BREAKDOWN = ("notice", "stop_and_rendezvous", "interpreter", "imports", "process_group", "build", "restore",
             "first_step")


def breakdown(t_fail: float, detected: float | None, start: dict, first_step_time: float) -> dict | None:
    """Seconds per phase of :data:`BREAKDOWN` for an attempt whose ``start`` event carries ``startup``."""
    su = start.get("startup") or {}
    if detected is None or not su.get("exec_time"):
        return None
    out = {"notice": detected - t_fail, "stop_and_rendezvous": su["exec_time"] - detected}
    out.update({k: su.get(f"{k}_s") for k in BREAKDOWN[2:-1]})
    out["first_step"] = first_step_time - start["time"]
    return {k: None if v is None else round(v, 2) for k, v in out.items()}


def first_detection(t_fail: float, detections: list[float], records: list[dict]) -> float | None:
    """Earliest time at or after ``t_fail`` the platform noticed a failure or the job logged a signal."""
    cands = [t for t in detections if t >= t_fail]
    cands += [r["time"] for r in records if r.get("event") == "signal" and r["time"] >= t_fail]
    return min(cands) if cands else None


def recovery(kind: str, t_fail: float, attempts: list[Attempt], detections: list[float],
             records: list[dict], until: float | None = None, *, want_world: int | None = None,
             detect: bool = True) -> Recovery:
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
        done_before = [s["step"] for b in attempts if b.start["time"] < rec_attempt.start["time"]
                       for s in b.steps]
        steps_lost = max(0, (max(done_before) if done_before else 0) - rec_attempt.resumed_from)
    det = first_detection(t_fail, detections, records) if detect else None
    parts = None if rec_step is None else breakdown(t_fail, det, rec_attempt.start, rec_step["time"])
    return Recovery(kind=kind, time=t_fail, detect_s=None if det is None else det - t_fail, breakdown=parts,
                    recover_s=None if rec_step is None else rec_step["time"] - t_fail,
                    steps_lost=steps_lost, restarts=len(after),
                    world_after=None if rec_step is None else rec_step["world_size"],
                    tier=None if rec_step is None else (rec_attempt.start.get("restored_from") or {}).get("tier"))


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

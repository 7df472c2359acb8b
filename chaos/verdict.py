"""Verdicts: what every chaos scenario must show, on every platform, with the evidence for each check.

A platform harness runs a job, injects a fault and then hands an :class:`Observation` (the job's metrics
records, the faults with the harness's proof that each took effect, the times the platform noticed them, how
the job ended, its final checkpoint and the reference's) to :func:`judge` with the scenario's
:class:`Expectation`. The standard checks are the same everywhere:

* **fault injected**: the harness recorded the fault *and* confirmed its effect (the process is gone or
  stopped, the node is DOWN, the file is truncated, the signal reached the job);
* **failure noticed**: the platform or the job noticed it after it happened;
* **job restarted**: a new attempt of the job started after the fault and trained again;
* **steps recomputed** within the scenario's bound;
* and the result: completed, one consistent history, every sample used exactly once, final weights equal
  to the uninterrupted reference (bitwise, or within a tolerance when the world size changed), same losses.

So a run in which nothing happened fails every scenario, whatever the harness claims: see
``tests/unit/failover/test_verdicts.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from training.goodput.analysis import (
    ChainError,
    Recovery,
    effective_steps,
    exactly_once,
    goodput,
    max_loss_diff,
    recovery,
    split_attempts,
    world_sizes,
)


@dataclass
class Check:
    """One verdict line: its name, whether it held, and the evidence either way."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class Fault:
    """One fault as the harness injected it.

    Attributes:
        label: what was done, for the report (``SIGKILL worker``, ``kill node n2``, ...).
        time: wall-clock time it was done.
        confirmed: the harness verified the effect (not just that it sent the command).
        evidence: how it was verified, or why it could not be.
    """

    label: str
    time: float
    confirmed: bool
    evidence: str


@dataclass(frozen=True)
class Expectation:
    """What a scenario promises.

    Attributes:
        outcome: ``bitwise`` (same world size: final weights equal the reference's), ``close`` (the world size
            changed: within ``atol``), or ``fail`` (the job must stop with an error, checkpoints intact).
        restart: a new attempt of the job must start after the fault and log a step.
        noticed: the platform (or the job, for a signal) must notice the fault.
        max_steps_lost: recomputed steps allowed per fault (None: reported, not bounded).
        rejoin_world: after a rejoin the job must train at this world size again.
        atol: tolerance for ``close``.
    """

    outcome: str = "bitwise"
    restart: bool = True
    noticed: bool = True
    max_steps_lost: int | None = None
    rejoin_world: int | None = None
    atol: float = 1e-4


@dataclass
class Observation:
    """What a harness collected from one scenario run (the only input of a verdict).

    Attributes:
        records: the job's metrics.jsonl events, every attempt.
        faults: the faults injected, in order.
        detections: times at which the platform noticed a failure (agent log lines, Slurm DOWN, JobSet restart).
        rejoins: times at which a lost node was brought back (the job is expected to grow again).
        exited_ok: the platform's view of the end: True = succeeded, False = failed, None = still running.
        exit_detail: the exit codes / job state behind ``exited_ok``.
        steps, global_batch: the job's length and samples per step (for completion and exactly-once).
        final_committed: the final checkpoint exists with its commit marker.
        weight_diffs: differing tensors of the final checkpoint vs the reference ([] = equal; None = not compared).
        reference_records: the reference run's records (for the loss comparison).
        wall_s: the scenario's wall time (for goodput).
        error: a harness error (a wait timed out, the job ended early), if any.
        logs: timestamped output of the job's processes (``(time, line)``), for scenario-specific checks.
        checkpoint_dir: the job's checkpoint directory, where the harness can read it.
        facts: what else the harness observed that a scenario check needs (named in each check).
    """

    records: list[dict]
    faults: list[Fault]
    detections: list[float] = field(default_factory=list)
    rejoins: list[float] = field(default_factory=list)
    exited_ok: bool | None = None
    exit_detail: str = ""
    steps: int = 0
    global_batch: int = 0
    final_committed: bool = False
    weight_diffs: list[str] | None = None
    reference_records: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    logs: list[tuple[float, str]] = field(default_factory=list)
    checkpoint_dir: Path | None = None
    facts: dict = field(default_factory=dict)

    def log_has(self, needle: str) -> list[str]:
        return [line for _, line in self.logs if needle in line]


@dataclass
class Verdict:
    """The outcome of :func:`judge`: the checks, the recovery figures and the headline numbers."""

    checks: list[Check]
    recoveries: list[Recovery]
    world_sizes: list[int]
    useful_s: float
    goodput: float

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def judge(obs: Observation, expect: Expectation, extra: list[Callable[[Observation], Check]] = ()) -> Verdict:
    """Every standard check (module docstring) plus the scenario's ``extra`` checks."""
    records = obs.records
    attempts = split_attempts(records)
    checks: list[Check] = []
    if obs.error:
        checks.append(Check("ran to the end", False, obs.error.splitlines()[0][:300]))

    # ---- evidence: the fault happened, was noticed, and the job came back
    checks.append(
        Check(
            "fault injected",
            bool(obs.faults) and all(f.confirmed for f in obs.faults),
            "; ".join(f"{f.label}: {f.evidence}" for f in obs.faults) or "no fault was injected",
        )
    )
    recoveries = _recoveries(obs, attempts, expect)
    per_fault = [r for r in recoveries if r.kind != "rejoin"]
    if expect.noticed:
        ok = bool(per_fault) and all(r.detect_s is not None for r in per_fault)
        checks.append(
            Check(
                "failure noticed",
                ok,
                "; ".join(
                    f"{r.kind}: after {r.detect_s:.1f} s" if r.detect_s is not None else f"{r.kind}: nothing noticed it"
                    for r in per_fault
                )
                or "no fault to notice",
            )
        )
    if expect.restart:
        ok = bool(per_fault) and all(r.recover_s is not None for r in per_fault)
        checks.append(
            Check(
                "job restarted",
                ok,
                "; ".join(
                    f"{r.kind}: a new attempt trained {r.recover_s:.1f} s later, {r.steps_lost} step(s) recomputed"
                    + (f" (state from {r.tier})" if r.tier else "")
                    if r.recover_s is not None
                    else f"{r.kind}: no attempt started and trained after it"
                    for r in per_fault
                )
                or "no fault to recover from",
            )
        )
    if expect.max_steps_lost is not None:
        lost = [r.steps_lost for r in recoveries if r.kind != "rejoin"]
        checks.append(
            Check(
                f"steps recomputed <= {expect.max_steps_lost}",
                bool(lost) and all(x is not None and x <= expect.max_steps_lost for x in lost),
                f"steps recomputed per fault: {lost}",
            )
        )

    # ---- the result
    effective: list[dict] = []
    try:
        effective = effective_steps(attempts)
    except ChainError as e:
        checks.append(Check("consistent history", False, str(e)))
    useful, gp = goodput(effective, obs.wall_s)
    if expect.outcome == "fail":
        checks.append(Check("job stopped with an error", obs.exited_ok is False, obs.exit_detail))
    else:
        checks += _result_checks(obs, expect, effective)
    for fn in extra:
        try:
            checks.append(fn(obs))
        except Exception as e:  # noqa: BLE001 - a broken check fails the verdict, it does not stop the report
            checks.append(Check(getattr(fn, "__name__", "check"), False, f"{type(e).__name__}: {e}"))
    return Verdict(checks, recoveries, world_sizes(records), useful, gp)


def _recoveries(obs: Observation, attempts, expect: Expectation) -> list[Recovery]:
    """Figures per disruption (each fault, each rejoin), in time order."""
    marks = sorted([(f.time, f.label, False) for f in obs.faults] + [(t, "rejoin", True) for t in obs.rejoins])
    out = []
    for i, (t, label, is_rejoin) in enumerate(marks):
        until = marks[i + 1][0] if i + 1 < len(marks) else None
        out.append(
            recovery(
                label,
                t,
                attempts,
                obs.detections,
                obs.records,
                until,
                want_world=expect.rejoin_world if is_rejoin else None,
                detect=not is_rejoin,
            )
        )
    return out


def _result_checks(obs: Observation, expect: Expectation, effective: list[dict]) -> list[Check]:
    ended = [r for r in obs.records if r.get("event") == "end"]
    done = bool(obs.exited_ok) and obs.final_committed and bool(ended) and ended[-1].get("step") == obs.steps
    out = [
        Check(
            "completed",
            done,
            f"{obs.exit_detail}; end event at step "
            f"{ended[-1].get('step') if ended else None} of {obs.steps}; final checkpoint committed: "
            f"{obs.final_committed}",
        )
    ]
    problems = exactly_once(effective, obs.global_batch, obs.steps) if effective else ["no effective steps"]
    out.append(
        Check(
            "every sample exactly once",
            not problems,
            "; ".join(problems[:3]) or f"{obs.steps} effective steps cover samples [0, {obs.steps * obs.global_batch})",
        )
    )
    exact = expect.outcome == "bitwise"
    name = "weights bitwise == reference" if exact else f"weights within {expect.atol:g} of reference"
    diffs = obs.weight_diffs
    out.append(
        Check(
            name,
            diffs is not None and not diffs,
            "not compared (no final checkpoint or no reference)"
            if diffs is None
            else f"{len(diffs)} differing tensors: {diffs[:2]}"
            if diffs
            else "model + optimizer state equal",
        )
    )
    dl = max_loss_diff(effective, _reference_effective(obs.reference_records))
    if dl is not None:
        out.append(
            Check(
                "losses == reference" if exact else "losses close to reference",
                dl == 0.0 if exact else dl < 1e-3,
                f"max |loss diff| {dl:.3g}",
            )
        )
    return out


def _reference_effective(records: list[dict]) -> list[dict]:
    """The reference run's effective steps ([] when there is none or its history is broken: no loss check)."""
    try:
        return effective_steps(split_attempts(records)) if records else []
    except ChainError:
        return []


def compare_weights(final: Path, reference: Path, atol: float = 0.0) -> list[str] | None:
    """Differing tensors (model + optimizer) of two local checkpoints; None when either is missing."""
    from training.checkpoint import MARKER

    if not (final / MARKER).exists() or not (reference / MARKER).exists():
        return None
    from training.compare import compare

    try:
        return compare(final, reference, atol)
    except ValueError as e:
        return [str(e)]

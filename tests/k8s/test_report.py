"""Chaos-report arithmetic (shared by the emulator and the EKS chaos harness) on hand-made metrics."""
from __future__ import annotations

from chaos import k8s_report as report
from chaos.eks import verdicts


def metrics(*segments: tuple[int | None, range, float], end: int | None = None) -> list[dict]:
    """Events: per segment (resumed_from, steps, start time); steps 1 s apart."""
    ev = []
    for resumed, steps, t in segments:
        ev.append({"event": "start", "time": t, "resumed_from": resumed, "world_size": 2})
        for i, s in enumerate(steps):
            ev.append({"event": "step", "time": t + 1 + i, "step": s, "step_time_s": 1.0})
    if end is not None:
        ev.append({"event": "end", "time": ev[-1]["time"] + 0.5, "step": end})
    return ev


def test_one_fault_resume_from_checkpoint():
    ev = metrics((None, range(1, 7), 0.0), (4, range(5, 11), 20.0), end=10)
    rep = report.analyze(ev, [{"label": "kill", "time": 6.5}], total_steps=10)
    assert rep["continuity_ok"] and rep["completed"] and rep["segments"] == 2
    (f,) = rep["faults"]
    assert f["last_step_before"] == 6 and f["resumed_from"] == 4 and f["steps_lost"] == 2
    assert f["recover_s"] == 14.5  # fault at 6.5 -> first step of the new attempt at 21
    assert rep["steps_recomputed"] == 2
    rep.update(jobset_restarts=1)
    assert verdicts(rep, expected_faults=1, interval=2) == []
    assert "steps lost" in report.format_report(rep) or "lost" in report.format_report(rep)


def test_gap_and_no_completion_are_failures():
    ev = metrics((None, range(1, 7), 0.0), (6, range(8, 11), 20.0))  # step 7 never logged, no end
    rep = report.analyze(ev, [{"label": "kill", "time": 6.5}], total_steps=10)
    assert not rep["continuity_ok"] and rep["missing_steps"] == [7]
    rep.update(jobset_restarts=1)
    bad = verdicts(rep, expected_faults=1, interval=2)
    assert any("did not complete" in b for b in bad) and any("continuity" in b for b in bad)


def test_too_many_steps_lost_fails():
    ev = metrics((None, range(1, 10), 0.0), (2, range(3, 13), 20.0), end=12)
    rep = report.analyze(ev, [{"label": "kill", "time": 9.5}], total_steps=12)
    rep.update(jobset_restarts=1)
    assert any("steps lost > checkpoint interval" in b for b in verdicts(rep, 1, interval=5))


def test_torn_last_line_is_ignored():
    assert report.parse_events('{"event": "start", "time": 1}\n{"event": "st') == [{"event": "start", "time": 1}]

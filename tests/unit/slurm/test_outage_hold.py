"""The Slurm harness holds a store-outage job at a step boundary through the rest of the outage (instead of pacing
every step): when it holds, when it lets go, and that the scenario that kills workers meanwhile is not held by it."""

from __future__ import annotations

import time
from pathlib import Path

from chaos.slurm import RELEASE_AFTER_S, Runner, Seen, SlurmChaosConfig, Tail, scenarios
from chaos.split_brain import HOLD_FILE

CFG = SlurmChaosConfig()


def seen_at(run_dir: Path, stopped: float) -> Seen:
    s = Seen(1, Tail(run_dir / "metrics.jsonl"), Tail(run_dir / "slurm-1.out"), run_dir)
    s.watch.update(store_stopped=stopped)
    s.records = [{"event": "step", "step": n, "time": float(n)} for n in range(1, 4)]  # steps 1-3 before the fault
    return s


def test_held_from_a_step_during_the_outage_until_an_agent_says_the_store_answers(tmp_path):
    sc, runner, hold = scenarios(CFG)["store-outage"], Runner(CFG, None, tmp_path), tmp_path / HOLD_FILE
    seen = seen_at(tmp_path, stopped=3.5)
    runner.hold_through_outage(sc, seen)
    assert not hold.exists()  # no step logged yet with no member running: the check needs one
    seen.records.append({"event": "step", "step": 4, "time": 4.0})
    runner.hold_through_outage(sc, seen)
    assert hold.exists()
    now = time.time()  # the members answer again now: well inside RELEASE_AFTER_S
    seen.watch.update(store_started=now - 1, store_back=now)
    seen.logs = [(5.0, "1: [rendezvous] membership store unreachable: keep-alives paused, training goes on")]
    runner.hold_through_outage(sc, seen)
    assert hold.exists()  # back, but no agent said so yet
    seen.logs.append((now, "1: [rendezvous] membership store answers again: keep-alives resumed"))
    runner.hold_through_outage(sc, seen)
    assert not hold.exists() and "released" in seen.watch
    runner.hold_through_outage(sc, seen)
    assert not hold.exists()  # held once


def test_let_go_anyway_a_while_after_the_store_is_back(tmp_path):
    sc, runner, hold = scenarios(CFG)["store-outage"], Runner(CFG, None, tmp_path), tmp_path / HOLD_FILE
    seen = seen_at(tmp_path, stopped=3.5)
    seen.records.append({"event": "step", "step": 4, "time": 4.0})
    runner.hold_through_outage(sc, seen)
    seen.watch.update(store_started=1.0, store_back=2.0)  # long ago: RELEASE_AFTER_S passed without the line
    runner.hold_through_outage(sc, seen)
    assert RELEASE_AFTER_S > 0 and not hold.exists()


def test_only_the_outage_is_held_by_the_harness_and_no_store_scenario_paces_its_steps(tmp_path):
    table = scenarios(CFG)
    seen = seen_at(tmp_path, stopped=0.5)
    Runner(CFG, None, tmp_path).hold_through_outage(table["store-outage-then-worker-kill"], seen)
    assert not (tmp_path / HOLD_FILE).exists()  # its fault holds the job only until the worker kill
    for name in ("store-outage", "store-outage-then-worker-kill"):
        assert table[name].hold and "--fault.step_sleep_s" not in table[name].train_args, name


def test_a_worker_kill_holds_the_job_until_it_landed():
    """fault.sh took 2 s to kill the workers on a loaded machine, after the 12-step job had finished (CI)."""
    sc = scenarios(CFG)["worker-kill"]
    assert sc.hold and sc.inject.__name__ == "kill_workers_held"

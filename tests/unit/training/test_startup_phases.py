"""A worker's start-up by phase: the clock (training.job.startup), the spawn stamp its agent sets
(training.launch.spawn_time), and the breakdown the ledger and `make status` read from given records
(training.goodput.analysis.startup_phases, training.goodput.ledger)."""

from __future__ import annotations

import json
import time

import pytest

from tools.status import Where, screen
from training.goodput.analysis import STARTUP_PHASES, breakdown, parse_records, startup_phases
from training.goodput.ledger import ledger_from_records, ledger_text
from training.job.startup import PHASES, SPAWN_TIME_ENV, StartupClock, process_age_s, spawn_time
from training.launch.spawn_time import SpawnStamped, stamp_spawn_time


def test_the_clock_begins_at_the_agents_spawn_and_adds_up_a_phase_marked_twice():
    spawned = time.time() - process_age_s() - 2.0  # before this process's exec, as an agent's spawn is
    clock = StartupClock({SPAWN_TIME_ENV: repr(spawned)})
    clock.mark("device_init")
    clock.mark("job_setup")
    clock.mark("model_build")
    clock.mark("job_setup")
    su = clock.summary()
    assert su["began"] == su["spawn_time"] == spawned
    assert su["process_start_s"] == pytest.approx(clock.marks[0][1] - spawned, abs=0.01)
    assert set(su) >= {f"{p}_s" for p in ("process_start", "device_init", "job_setup", "model_build")}
    total = sum(v for k, v in su.items() if k.endswith("_s"))
    assert total == pytest.approx(clock.marks[-1][1] - spawned, abs=0.01)


def test_a_spawn_time_that_is_no_time_or_after_the_exec_is_not_used():
    assert spawn_time({SPAWN_TIME_ENV: "nan"}) is None and spawn_time({SPAWN_TIME_ENV: "soon"}) is None
    assert spawn_time({}) is None
    late = StartupClock({SPAWN_TIME_ENV: repr(time.time() + 60)})  # not this process's spawn
    assert late.summary()["began"] == late.exec_time


def test_the_agent_stamps_every_workers_environment_right_before_the_start(tmp_path):
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs

    class Config:
        logs_specs = DefaultLogsSpecs(log_dir=str(tmp_path))

    cfg = stamp_spawn_time(Config())
    assert stamp_spawn_time(cfg).logs_specs is cfg.logs_specs  # wrapped once
    envs = {0: {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"}, 1: {"TORCHELASTIC_RUN_ID": "r"}}
    envs[1]["TORCHELASTIC_RESTART_COUNT"] = "0"
    before = time.time()
    dest = cfg.logs_specs.reify(envs)
    assert isinstance(cfg.logs_specs, SpawnStamped) and cfg.logs_specs.root_log_dir == str(tmp_path)
    assert set(dest.stdouts) == {0, 1}  # the wrapped specs still decide the logs
    assert before <= spawn_time(envs[0]) == spawn_time(envs[1]) <= time.time()


def _run(compiled: bool) -> list[dict]:
    """Records of a run killed after step 3 and restarted: its attempts' start-ups as the trainer writes them."""

    def startup(began: float, preloaded: bool) -> dict:
        phases = dict(zip(PHASES, (0.2, 0.0 if preloaded else 3.0, 0.1, 0.4, 1.5, 0.3, 0.6)))
        return {
            "began": began,
            "spawn_time": began,
            "exec_time": began + 0.05,
            "preloaded": preloaded,
            "compiled": compiled,
            **{f"{k}_s": v for k, v in phases.items()},
        }

    first_step = 12.0 if compiled else 2.0
    recs = [{"event": "start", "time": 106.1, "world_size": 2, "restart_count": 0, "startup": startup(100.0, False)}]
    recs += [
        {"event": "step", "time": 106.1 + first_step + 1.0 * (n - 1), "step": n, "world_size": 2, "step_time_s": t}
        for n, t in zip((1, 2, 3), (first_step, 1.0, 1.0))
    ]
    recs += [{"event": "start", "time": 123.1, "world_size": 2, "restart_count": 1, "resumed_from": 2}]
    recs[-1]["startup"] = startup(120.0, True)
    recs += [
        {"event": "step", "time": 123.1 + first_step + 1.1 * (n - 3), "step": n, "world_size": 2, "step_time_s": t}
        for n, t in zip((3, 4, 5, 6), (first_step, 1.1, 0.9, 1.0))
    ]
    recs[-4] |= {"ckpt_block_s": 0.7, "snapshot_block_s": 0.2}  # the restart's first step waited for a save
    return parse_records("\n".join(json.dumps(r) for r in recs) + "\n")


def test_the_phases_of_a_start_come_from_its_start_record_and_its_first_steps():
    recs = _run(compiled=True)
    start, steps = recs[4], recs[5:]
    phases = startup_phases(start, steps)
    assert list(phases) == list(STARTUP_PHASES)
    assert phases["process_start"] == 0.2 and phases["imports"] == 0.0 and phases["restore"] == 0.6
    # compile: the first step (12 s) less the median of the next three (1.0 s); the rest of it is the first step
    assert phases["compile"] == pytest.approx(11.0)
    assert phases["first_step"] == pytest.approx(12.0 - 11.0)
    # from the spawn to the first step's record: every phase, nothing twice
    assert sum(phases.values()) == pytest.approx(steps[0]["time"] - start["startup"]["began"], abs=0.02)
    assert startup_phases(start, steps[:1])["compile"] is None  # no steady step yet: unknown, all in first_step
    plain = _run(compiled=False)
    assert startup_phases(plain[4], plain[5:])["compile"] == 0.0
    # a restart's breakdown: noticed, then stop + rendezvous until the spawn, then the worker's phases
    parts = breakdown(119.0, 119.5, start, steps)
    assert parts["notice"] == 0.5 and parts["stop_and_rendezvous"] == 0.5 and parts["compile"] == 11.0


def test_records_of_older_workers_keep_their_phases_under_the_new_names():
    start = {
        "event": "start",
        "time": 20.0,
        "startup": {"exec_time": 11.0, "interpreter_s": 0.5, "imports_s": 4.0, "process_group_s": 1.5, "build_s": 2.0},
    }
    phases = startup_phases(start, [{"event": "step", "time": 25.0, "step": 1, "world_size": 1}])
    assert phases["process_start"] == 0.5 and phases["model_build"] == 2.0 and phases["device_init"] is None
    assert startup_phases({"event": "start", "time": 1.0}, []) is None


def test_the_ledger_and_the_status_screen_show_each_start_by_phase():
    ledger = ledger_from_records("runs/x", _run(compiled=True), total_steps=6)
    assert [(s.attempt, s.restart_count, s.preloaded, s.compiled) for s in ledger.starts] == [
        (1, 0, False, True),
        (2, 1, True, True),
    ]
    cold, restart = ledger.starts
    assert cold.phases["imports"] == 3.0 and restart.phases["imports"] == 0.0
    assert restart.total_s == pytest.approx(123.1 + 12.0 - 120.0)
    (failure,) = ledger.failures
    assert failure.startup == restart.phases
    # start-up in the failure row: the worker's own phases before the restore
    assert failure.phases["startup"] == pytest.approx(0.2 + 0.0 + 0.1 + 0.4 + 1.5 + 0.3)
    assert failure.phases["compile"] == pytest.approx(12.0 - 1.0)
    text = ledger_text(ledger)
    assert "start-up by phase" in text and "restart, warm, compiled" in text and "launch, cold, compiled" in text
    row = next(line for line in text.splitlines() if line.startswith("attempt 2 "))
    assert row.split()[:11] == ["attempt", "2", "0.2", "0.0", "0.1", "0.4", "1.5", "0.3", "0.6", "11.0", "1.0"]
    # then the total and, of the first step, its waits for a save and a snapshot; '-' where none was recorded
    assert row.split()[12] == "0.9" and (cold.first_step_waits_s, restart.first_step_waits_s) == (None, 0.9)
    assert next(line for line in text.splitlines() if line.startswith("attempt 1 ")).split()[12] == "-"
    # the failure table's rows are the lines that begin with a number
    assert [line.split()[1] for line in text.splitlines() if line.strip()[:2] in ("1 ", "2 ")] == ["3"]
    shown = screen(ledger, Where(label="local run", running=False), now=200.0)
    assert "start    attempt 2: 15.1 s: process 0.2, device 0.1, pgroup 0.4, model 1.5" in shown
    assert "compile 11.0" in shown and "(restart, warm, compiled)" in shown


def test_a_start_record_with_odd_flags_is_still_read():
    recs = _run(compiled=True)
    recs[4]["startup"].update(preloaded="yes", compiled=1)  # a hand-edited file: flags the arithmetic does not need
    ledger = ledger_from_records("runs/x", recs, total_steps=6)
    assert (ledger.starts[1].preloaded, ledger.starts[1].compiled) == (None, False)
    assert "restart, ?" in ledger_text(ledger)

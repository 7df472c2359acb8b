"""What an operator watches of real runs: the goodput ledger (python -m training.goodput RUN_DIR) and the
TensorBoard event files, of one run with two injected worker kills restarted by its agent, and of an
uninterrupted one. Every figure is checked against the run's own metrics events (and the agent's timestamped
log), not against the arithmetic the ledger shares with the chaos core; the event files are read back with
TensorBoard's own reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, TINY_STEPS

FAULTS = ("--fault.sigkill_at_step", "2", "--fault.kill_in_snapshot_at_step", "5", "--fault.rank", "1")


def ledger_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.goodput", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def by_attempt(recs: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for r in recs:
        if r["event"] == "start":
            out.append([])
        out[-1].append(r)
    return out


@pytest.fixture(scope="module")
def two_kills(tmp_path_factory) -> tuple[Path, Path]:
    """One node x 2 workers (the launcher the clusters use, restarts allowed): rank 1 SIGKILLs itself after step 2
    and halfway through step 5's memory snapshot; the agent restarts the group each time. The launcher's output
    is kept as a timestamped agent log, as the chaos harness keeps it."""
    base = tmp_path_factory.mktemp("two_kills")
    run, log = base / "run", base / "agent.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "T5F_MEMORY_DIR": str(base / "shm")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            "1",
            "--min-nodes",
            "1",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--",
            *TINY,
            "--job.out_dir",
            str(run),
            "--train.steps",
            str(TINY_STEPS),
            "--checkpoint.interval",
            "3",
            "--checkpoint.memory_interval",
            "1",
            *FAULTS,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with open(log, "w") as f:
        for line in proc.stdout:
            f.write(f"{time.time():.3f} {line}")
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "[fault] rank 1 SIGKILLs itself after step 2" in text
    assert "halfway through the memory snapshot of step 5" in text
    return run, log


@pytest.mark.e2e
def test_the_ledger_of_two_injected_failures_matches_the_metrics_events(two_kills):
    run, log = two_kills
    r = ledger_cli(run, "--json", "--agent-log", log)
    assert r.returncode == 0, r.stderr
    ledger = json.loads(r.stdout)
    recs = records(run)
    attempts = by_attempt(recs)
    assert len(attempts) == 3 and len(ledger["failures"]) == 2
    agent_lines = [(float(t), line) for t, _, line in (x.partition(" ") for x in log.read_text().splitlines())]
    noticed = [t for t, line in agent_lines if "failed (exitcode" in line]  # torchrun saw a worker exit
    for n, (failure, before, after) in enumerate(zip(ledger["failures"], attempts, attempts[1:])):
        steps_before = [x for x in before if x["event"] == "step"]
        start, steps_after = after[0], [x for x in after if x["event"] == "step"]
        last = steps_before[-1]
        assert failure["step"] == last["step"] == (2, 5)[n]  # the step each fault followed
        assert failure["time"] == pytest.approx(last["time"])  # the interrupted attempt's last sign of life
        rec = failure["recovery"]
        # the snapshot of the step a kill followed may or may not have been complete: 0 or 1 step recomputed
        assert rec["steps_lost"] == last["step"] - start["resumed_from"] in (0, 1)
        assert rec["tier"] == start["restored_from"]["tier"] == "memory"
        assert rec["recover_s"] == pytest.approx(steps_after[0]["time"] - last["time"])
        # noticed by the job itself (rank 0's crashed end record) or by torchrun, whichever came first
        end = [x for x in before if x["event"] == "end"]
        first_notice = min(
            [x["time"] for x in end if x["status"] == "crashed"] + [t for t in noticed if t >= last["time"]]
        )
        assert failure["phases"]["detect"] == pytest.approx(first_notice - last["time"], abs=0.011)
        su = start["startup"]
        assert failure["phases"]["stop_and_rendezvous"] == pytest.approx(
            (su.get("began") or su["exec_time"]) - first_notice, abs=0.011
        )
        assert failure["phases"]["restore"] == pytest.approx(su["restore_s"], abs=0.006)
        assert failure["phases"]["first_step"] == pytest.approx(steps_after[0]["time"] - start["time"], abs=0.006)
        if rec["steps_lost"]:  # back where it was when it recorded that step again
            redone = next(x for x in steps_after if x["step"] == last["step"])
            recompute, cost = redone["time"] - steps_after[0]["time"], redone["time"] - last["time"]
        else:  # back where it was as its first step began
            recompute, cost = 0.0, steps_after[0]["time"] - steps_after[0]["step_time_s"] - last["time"]
        assert failure["phases"]["recompute"] == pytest.approx(recompute, abs=0.006)
        assert failure["cost_s"] == pytest.approx(cost, abs=0.002)
    # goodput: each step's newest record is the one the final weights contain; wall from the first worker's exec
    newest = {x["step"]: x for x in recs if x["event"] == "step"}
    assert sorted(newest) == list(range(1, TINY_STEPS + 1))
    useful = sum(x["step_time_s"] for x in newest.values())
    first = attempts[0][0]["startup"]  # the ledger's wall starts at the first worker's spawn (its agent's stamp)
    wall = recs[-1]["time"] - (first.get("began") or first["exec_time"])
    assert ledger["useful_s"] == pytest.approx(useful, abs=0.002) and ledger["wall_s"] == pytest.approx(wall, abs=0.002)
    assert ledger["goodput"] == pytest.approx(useful / wall, rel=1e-3)
    lost = sum(f["cost_s"] for f in ledger["failures"])
    assert ledger["uninterrupted_goodput"] == pytest.approx(useful / (wall - lost), rel=1e-3)
    assert ledger["goodput"] < ledger["uninterrupted_goodput"]
    assert (ledger["status"], ledger["step"], ledger["total_steps"]) == ("finished", TINY_STEPS, TINY_STEPS)


@pytest.mark.e2e
def test_the_printed_ledger_and_its_timeline(two_kills, tmp_path):
    run, _ = two_kills
    png = tmp_path / "t.png"
    r = ledger_cli(run, "--png", png)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert [row[1] for row in rows] == ["2", "5"]  # one row per failure, after the step it followed
    assert "goodput " in r.stdout and "uninterrupted estimate " in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    s = ledger_cli(run, "--summary")
    assert s.returncode == 0 and len(s.stdout.splitlines()) == 1 and "2 failure(s) cost" in s.stdout


@pytest.mark.e2e
def test_an_uninterrupted_run_has_no_failures(tiny_reference):
    r = ledger_cli(tiny_reference, "--json", "--no-png")
    assert r.returncode == 0, r.stderr
    ledger = json.loads(r.stdout)
    assert ledger["failures"] == [] and ledger["attempts"] == 1 and ledger["status"] == "finished"
    assert ledger["goodput"] == ledger["uninterrupted_goodput"] > 0


def test_a_bad_run_dir_is_one_line_naming_it(tmp_path):
    r = ledger_cli(tmp_path / "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and str(tmp_path / "nope") in r.stderr
    assert "does not exist" in r.stderr
    r = ledger_cli(tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no metrics.jsonl" in r.stderr
    (tmp_path / "metrics.jsonl").write_text("")
    r = ledger_cli(tmp_path)
    assert r.returncode == 2 and "no start record yet" in r.stderr


def read_board(run: Path):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.mark.e2e
def test_tensorboard_shows_the_steps_the_weights_contain_and_a_marker_per_restart(two_kills):
    run, _ = two_kills
    board = read_board(run)
    recs = records(run)
    newest = {x["step"]: x for x in recs if x["event"] == "step"}  # a restart's records replace the lost ones
    for field, tag in [
        ("loss", "train/loss"),
        ("lr", "train/lr"),
        ("grad_norm", "train/grad_norm"),
        ("tokens_per_s", "perf/tokens_per_s"),
        ("step_time_s", "perf/step_time_s"),
        ("world_size", "job/world_size"),
    ]:
        got = board.Scalars(tag)
        assert [e.step for e in got] == list(range(1, TINY_STEPS + 1)), tag  # each step once: the purged copies gone
        assert [e.value for e in got] == pytest.approx([newest[e.step][field] for e in got], rel=1e-6), tag
        assert [e.wall_time for e in got] == pytest.approx([newest[e.step]["time"] for e in got], abs=1e-3), tag
    starts = [x for x in recs if x["event"] == "start"]
    assert (
        [(e.step, e.value) for e in board.Scalars("job/restarts")]
        == [(x["resumed_from"] or 0, x["restart_count"]) for x in starts]
        == [(0, 0), (starts[1]["resumed_from"], 1), (starts[2]["resumed_from"], 2)]
    )
    assert [e.step for e in board.Scalars("job/failures")] == [x["resumed_from"] for x in starts[1:]]
    events = [e.tensor_proto.string_val[0].decode() for e in board.Tensors("job/events/text_summary")]
    assert sum(t.startswith("attempt ") and " started at world size 2" in t for t in events) == 3, events
    assert any("resumed from step" in t and "(memory)" in t for t in events), events


@pytest.mark.e2e
def test_tensorboard_of_an_uninterrupted_run_has_no_restart(tiny_reference):
    board = read_board(tiny_reference)
    assert [e.step for e in board.Scalars("train/loss")] == list(range(1, TINY_STEPS + 1))
    assert [(e.step, e.value) for e in board.Scalars("job/restarts")] == [(0, 0)]
    assert "job/failures" not in board.Tags()["scalars"]

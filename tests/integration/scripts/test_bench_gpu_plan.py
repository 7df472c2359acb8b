"""scripts/bench_gpu.sh's plan on any machine (DRY_RUN=1: no CUDA check, no run, each row costs its estimate on a
simulated clock): the rows in priority order, a row started only while the budget holds its estimate, the others
named "skipped: budget" in summary.json, a cheaper later row still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration
ORDER = ["preset", "compile", "saves", "restart", "hf", "flex", "flex-compile", "adamw-foreach", "compile-report"]
ORDER += ["batch-fit"]


def _plan(tmp_path, **env) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "gpu"
    r = subprocess.run(
        ["bash", "scripts/bench_gpu.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "PYTHON": sys.executable, "DRY_RUN": "1", "OUT": str(out), **env},
    )
    summary = out / "summary.json"
    return r, json.loads(summary.read_text()) if summary.exists() else None


def test_every_row_runs_in_priority_order_when_the_budget_holds_them(tmp_path):
    r, summary = _plan(tmp_path, BUDGET_S="1200")
    assert r.returncode == 0, r.stderr
    assert [row["row"] for row in summary["rows"]] == ORDER
    assert {row["status"] for row in summary["rows"]} == {"dry-run"}
    # the commands in order, each named with what it measures
    lines = [line for line in r.stderr.splitlines() if line.startswith("[bench_gpu] ") and "~" in line]
    assert [line.split()[2] for line in lines] == ORDER
    assert "--parallel.compile on" in lines[1] and "--saves 2" in lines[2] and "bench_restart.sh" in lines[3]
    assert "training.bench_hf --preset t5-large" in lines[4]
    # the MFU levers (issue 51), each on its own row
    assert lines[5].endswith("--model.attention flex --model.dropout 0") and "flex.json" in lines[5]
    assert lines[6].endswith("--model.attention flex --model.dropout 0 --parallel.compile on")
    assert lines[7].endswith("--train.adamw_impl foreach")
    assert "training.compile_report --preset t5-large" in lines[8] and "--model.attention flex" in lines[8]
    assert "PRESET=t5-large BATCH=32 STEPS=20 scripts/bench_batch_fit.sh" in lines[9]  # lever 5


def test_rows_past_the_budget_are_named_and_a_cheaper_later_row_still_runs(tmp_path):
    # default estimates 60 + 95 + 240 = 395 s: 45 s left, not the restart's 200, enough for the baseline's 40
    r, summary = _plan(tmp_path, BUDGET_S="440")
    assert r.returncode == 0, r.stderr
    status = {row["row"]: row["status"] for row in summary["rows"]}
    assert status == {
        "preset": "dry-run",
        "compile": "dry-run",
        "saves": "dry-run",
        "restart": "skipped: budget",
        "hf": "dry-run",
        "flex": "skipped: budget",
        "flex-compile": "skipped: budget",
        "adamw-foreach": "skipped: budget",
        "compile-report": "skipped: budget",
        "batch-fit": "skipped: budget",
    }
    assert summary["used_s"] == 435 and summary["budget_s"] == 440
    assert "restart: skipped: budget (needs ~200 s, 45 s left of 440)" in r.stderr


def test_the_estimates_can_be_given_and_the_default_budget_is_480_s(tmp_path):
    r, summary = _plan(tmp_path, EST_SAVES="400")
    assert r.returncode == 0, r.stderr
    assert summary["budget_s"] == 480
    status = [row["status"] for row in summary["rows"]]
    # 60 + 95 + 200 + 40 = 395; then 90 (flex) and 120 do not fit, 60 does, 90 does not
    assert status == ["dry-run", "dry-run", "skipped: budget", "dry-run", "dry-run"] + ["skipped: budget"] * 2 + [
        "dry-run",
        "skipped: budget",
        "skipped: budget",
    ]


def test_rows_can_be_chosen_and_an_unknown_one_is_one_line_and_exit_2(tmp_path):
    r, summary = _plan(tmp_path, ROWS="preset flex flex-compile hf", EST_FLEX_COMPILE="30")
    assert r.returncode == 0, r.stderr
    assert [(row["row"], row["estimate_s"]) for row in summary["rows"]] == [
        ("preset", 60),
        ("flex", 90),
        ("flex-compile", 30),
        ("hf", 40),
    ]
    r, summary = _plan(tmp_path / "bad", ROWS="preset flash")
    assert r.returncode == 2 and summary is None
    assert "ROWS names 'flash', not a row" in r.stderr


def test_a_budget_that_is_no_number_is_one_line_and_exit_2(tmp_path):
    r, summary = _plan(tmp_path, BUDGET_S="8m")
    assert r.returncode == 2 and summary is None
    assert "BUDGET_S=8m is not whole seconds" in r.stderr

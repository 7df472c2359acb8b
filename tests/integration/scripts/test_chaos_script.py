"""`make chaos-test` (scripts/chaos.sh, python -m chaos.local) refuses a bad setting before anything starts: one
`error:` line naming the value and the fix, exit 2 (make's line then says "bad arguments", not a failed scenario),
no output directory, in the dry run as in the real run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import ROOT

# What the Makefile, an outer make or the caller's shell may set: each test says what it means.
ENV = {
    k: v
    for k, v in os.environ.items()
    if k
    not in (
        "PLATFORM",
        "DRY_RUN",
        "ARGS",
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
        "NODES",
        "NPROC",
        "SPARES",
        "SOAK",
        "PRESET",
    )
}


def chaos_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scripts/chaos.sh", *args], cwd=ROOT, env={**ENV, **env}, capture_output=True, text=True, timeout=120
    )


def make_chaos_test(*variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "chaos-test", *variables], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )


def refused(r: subprocess.CompletedProcess, line: str) -> None:
    """Exit 2 with exactly ``line`` on stderr, nothing on stdout (no plan, no banner)."""
    assert (r.returncode, r.stderr, r.stdout) == (2, line + "\n", ""), f"rc={r.returncode}\n{r.stdout}{r.stderr}"


def test_an_output_path_that_is_a_file_is_one_line_and_make_says_no_scenario_failed(tmp_path: Path) -> None:
    # It was a FileExistsError traceback after the checks, exit 1, and make's "a scenario failed its checks".
    file = tmp_path / "report"
    file.write_text("")
    fix = "give a directory path (it is created), or drop --out for .chaos/runs/<time>"
    refused(chaos_sh("--out", str(file)), f"error: --out {file}: not a directory: {fix}")
    refused(
        chaos_sh("--out", str(file / "run")), f"error: --out {file / 'run'}: not a directory ({file} is a file): {fix}"
    )
    r = make_chaos_test(f"ARGS=--out {file}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[0] == f"error: --out {file}: not a directory: {fix}", r.stderr
    assert "scripts/chaos.sh exited 2: bad arguments" in r.stderr and "a scenario failed" not in r.stderr, r.stderr
    assert file.read_text() == ""


def test_spares_is_checked_like_nodes_and_refused_by_the_scenarios_which_choose_their_own(tmp_path: Path) -> None:
    # It was ignored without a word, whatever its value.
    refused(chaos_sh(DRY_RUN="1", SPARES="abc"), "error: SPARES=abc must be 0 or a positive integer (hot-spare nodes)")
    line = (
        "error: SPARES=1: chaos-test's scenarios choose their own hot spares (node-kill-with-spare, "
        "node-kill-in-place, first-node-kill-in-place, silent-node-in-place, silent-node-during-save, straggler, "
        "straggler-in-place, "
        "split-brain run one); unset "
        "SPARES, or use it with "
        "SOAK=<duration> "
        "(the soak's hot spares, --soak-spares)"
    )
    refused(chaos_sh(DRY_RUN="1", SPARES="1"), line)
    out = tmp_path / "run"
    refused(chaos_sh("--out", str(out), SPARES="1"), line)  # the real run: refused before anything starts
    assert not out.exists()
    assert chaos_sh(DRY_RUN="1", SPARES="0").returncode == 0  # no spares asked for: nothing to refuse
    # the soak has hot spares: SPARES is their number (default 1), --soak-spares still wins
    soak = chaos_sh(DRY_RUN="1", SOAK="10m", SPARES="2")
    assert soak.returncode == 0 and "+ 2 hot spare(s)" in soak.stdout.splitlines()[0], soak.stdout + soak.stderr
    soak = chaos_sh("--soak-spares", "3", DRY_RUN="1", SOAK="10m", SPARES="2")
    assert soak.returncode == 0 and "+ 3 hot spare(s)" in soak.stdout.splitlines()[0], soak.stdout + soak.stderr


def test_a_misspelt_training_flag_is_refused_in_the_dry_run_and_before_the_real_run_starts(tmp_path: Path) -> None:
    # The dry run printed it in the agent's command as if it would run; the real run failed its reference run.
    line = "error: training flags after --: unknown option --train.stepz; did you mean --train.steps?"
    refused(chaos_sh("--", "--train.stepz", "3", DRY_RUN="1"), line)
    refused(
        chaos_sh("--", "--train.steps", "x", DRY_RUN="1"),
        "error: training flags after --: train.steps='x' is not a valid int",
    )
    out = tmp_path / "run"
    refused(chaos_sh("--out", str(out), "--", "--train.stepz", "3"), line)
    assert not out.exists()
    r = make_chaos_test("DRY_RUN=1", "ARGS=-- --train.stepz 3")
    assert r.returncode == 2 and r.stderr.splitlines()[0] == line and "Traceback" not in r.stderr, r.stderr
    good = chaos_sh("--", "--model.num_layers", "2", DRY_RUN="1")  # a valid one reaches the agent's command
    assert good.returncode == 0 and "--model.num_layers 2" in good.stdout, good.stderr

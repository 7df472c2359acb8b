"""`make help` lists every target and every variable the scripts read, with the default the scripts really use."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import MAKE_VARIABLES

ROOT = Path(__file__).resolve().parents[3]
VARIABLES = ("PLATFORM", "PRESET", "NPROC", "NODES", "ARGS", "DRY_RUN", "IMAGE_TAG")


def make_help() -> str:
    proc = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_lists_targets_and_variables_with_default_and_meaning() -> None:
    out = make_help()
    targets = re.findall(r"^([a-z-]+):.*## ", (ROOT / "Makefile").read_text(), flags=re.M)
    assert {"train", "synth", "chaos-test", "image"} <= set(targets)
    for target in targets:
        assert re.search(rf"^{target}\t\S", out, flags=re.M), target
    rows = dict(re.findall(r"^  ([A-Z_]+) +(\S.*)$", out, flags=re.M))
    assert set(VARIABLES) <= set(rows), f"make help lacks {set(VARIABLES) - set(rows)}"
    for name in VARIABLES:
        default, meaning = rows[name].split(None, 1)
        assert default and len(meaning) > 30, (name, rows[name])
    # Every variable the Makefile exports to the scripts is documented.
    exported = re.search(r"^export (.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    assert set(exported) <= set(rows), set(exported) - set(rows)
    # and none reaches a test from the make running the suite (TEST_WORKERS is the suite's own)
    assert set(exported) - {"TEST_WORKERS"} <= set(MAKE_VARIABLES), set(exported) - set(MAKE_VARIABLES)


def test_help_defaults_are_the_ones_the_local_train_script_uses() -> None:
    rows = dict(re.findall(r"^  ([A-Z_]+) +(\S+)", make_help(), flags=re.M))
    train = (ROOT / "scripts" / "train.sh").read_text()
    for name in ("PLATFORM", "PRESET", "NPROC", "NODES"):
        (default,) = re.findall(rf"\$\{{{name}:-([^}}]*)\}}", train)
        assert rows[name] == default, f"make help says {name}={rows[name]}, scripts/train.sh uses {default}"


def test_a_make_that_a_test_runs_gets_no_variable_of_the_make_running_the_suite() -> None:
    # Run alone this passes either way; test_test_script runs it under `make test ARGS=--durations=...`, where make
    # hands ARGS to every make below it unless the suite's conftest drops make's variables.
    proc = subprocess.run(
        ["make", "-s", "status", "PRESET=t5-3b"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        "error: run directory runs/t5-3b does not exist: give the run's job.out_dir (make train writes runs/<preset>)"
    ), proc.stderr

"""What the goodput ledger (python -m training.goodput RUN_DIR) and make status (scripts/status.sh ->
python -m tools.status) say of a run directory they cannot fully read: damaged or wrong-typed metrics lines, no
metrics file, a timeline PNG that cannot be written, a run directory given as make status's ARGS. Each answer is
the ledger or the screen (exit 0) with at most one warning line, or one error line (exit 2); never a traceback.
The real CLIs run on hand-made run directories."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

PY = str(ROOT / ".venv/bin/python")
ENV = {k: v for k, v in os.environ.items() if k not in ("PLATFORM", "PRESET", "ARGS", "MAKEFLAGS", "MAKELEVEL")}


def start(t: float, **kw) -> dict:
    return {"event": "start", "time": t, "world_size": 2, "restart_count": 0, "resumed_from": None, **kw}


def step(t: float, n: int, **kw) -> dict:
    return {
        "event": "step",
        "time": t,
        "step": n,
        "loss": 5.0,
        "world_size": 2,
        "step_time_s": 1.0,
        "tokens_per_s": 100.0,
        "data_offset": 0,
        **kw,
    }


GOOD = [start(1000.0)] + [step(1000.0 + n, n) for n in (1, 2, 3)]  # lines 1-4


def lines(*records) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def run_dir(tmp_path: Path, metrics: bytes) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_bytes(metrics)
    return d


def cli(module: str, *args) -> subprocess.CompletedProcess:
    # the timeout only stops a hang from holding the suite (a run directory must not make the ledger hang)
    return subprocess.run(
        [PY, "-m", module, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )


LEDGER = ("training.goodput", "--no-png")  # the ledger's figures; the PNG has its own tests below
STATUS = ("tools.status",)
BOTH = pytest.mark.parametrize("tool", [LEDGER, STATUS], ids=["ledger", "status"])


def one_line(r: subprocess.CompletedProcess, kind: str) -> str:
    """The one stderr line, checked: `kind: ...`, nothing else, no traceback."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"{kind}: "), r.stderr
    return r.stderr


# one line of binary: NULs, control characters, CR, bytes that are not UTF-8 (its newline the line's end)
GARBAGE = bytes(b for b in range(256) if b != ord("\n")) * 4 + b"\xff\xfe\xc3\x28 not utf-8\n"

SKIPPED = {  # metrics lines after GOOD -> what the warning says of the first (line 5)
    "binary garbage": (GARBAGE[:-1], "line 5: not JSON"),
    "a truncated line": (json.dumps(step(1004.0, 4))[:30].encode(), "line 5: not JSON"),
    "a null time and a string step": (
        b'{"event":"step","time":null,"step":"3"}',
        "line 5: time is null, not a finite number",
    ),
    "a string step": (step(1004.0, "4"), 'line 5: step is "4", not an integer'),
    "a true step": (step(1004.0, True), "line 5: step is true, not an integer"),
    "a string time": (step("1004", 4), 'line 5: time is "1004", not a finite number'),
    "a NaN time": (b'{"event":"step","time":NaN,"step":4,"world_size":2}', "line 5: time is NaN"),
    "a string step_time_s": (step(1004.0, 4, step_time_s="1"), 'line 5: step_time_s is "1", not a finite number'),
    "a string resumed_from": (start(1010.0, resumed_from="3"), 'line 5: resumed_from is "3", not an integer or null'),
    "a string startup": (start(1010.0, startup="x"), 'line 5: startup is "x", not an object'),
    "a string startup time": (start(1010.0, startup={"exec_time": "x"}), "line 5: startup is"),
    "an object as event": (b'{"event":{"a":1},"time":1004.0}', 'line 5: event is {"a": 1}, not a string'),
    "no world_size": (b'{"event":"step","time":1004.0,"step":4}', "line 5: world_size is missing"),
}


@BOTH
@pytest.mark.parametrize("bad", SKIPPED.values(), ids=SKIPPED.keys())
def test_lines_that_are_not_records_are_left_out_with_one_warning(tmp_path, tool, bad):
    content, said = bad
    d = run_dir(tmp_path, lines(*GOOD, content, step(1005.0, 4)))
    r = cli(*tool, d)
    assert r.returncode == 0, r.stderr
    warning = one_line(r, "warning")
    assert f"{d / 'metrics.jsonl'}: 1 line(s) are not records; the first, {said}" in warning, warning
    assert "fix or delete those lines" in warning
    if tool == LEDGER:
        assert f"goodput ledger of {d}: step 4, unfinished; 1 attempt(s)" in r.stdout, r.stdout
    else:
        assert r.stdout.startswith(f"job      {d} (local): ") and "\nstep     4/?" in r.stdout, r.stdout


@BOTH
def test_the_warning_counts_every_skipped_line_and_names_the_first(tmp_path, tool):
    d = run_dir(tmp_path, lines(GOOD[0], b"{", GOOD[1], step(None, 2), GARBAGE[:-1], *GOOD[2:]))
    r = cli(*tool, d)
    assert r.returncode == 0 and "3 line(s) are not records; the first, line 2: not JSON" in one_line(r, "warning")


@BOTH
def test_a_torn_last_line_is_no_warning(tmp_path, tool):
    # the job may be writing it right now: the line is left out, silently
    d = run_dir(tmp_path, lines(*GOOD) + json.dumps(step(1004.0, 4)).encode()[:25])
    r = cli(*tool, d)
    assert r.returncode == 0 and r.stderr == "", r.stderr


NO_START = {  # metrics.jsonl -> what the one error line says
    "binary garbage": (GARBAGE * 3, "has no start record (3 line(s) are not records; the first, line 1: not JSON"),
    "truncated lines": (
        b"".join(json.dumps(x).encode()[:20] + b"\n" for x in GOOD),
        "has no start record (4 line(s) are not records; the first, line 1: not JSON",
    ),
    "a string start time": (
        b'{"event":"start","time":"x"}\n',
        'has no start record (1 line(s) are not records; the first, line 1: time is "x", not a finite number)',
    ),
    "an empty file": (b"", "has no start record yet: the run has not reached its first step"),
}


@BOTH
@pytest.mark.parametrize("bad", NO_START.values(), ids=NO_START.keys())
def test_metrics_without_a_start_record_is_one_error_line(tmp_path, tool, bad):
    content, said = bad
    d = run_dir(tmp_path, content)
    r = cli(*tool, d)
    assert r.returncode == 2 and r.stdout == ""
    assert f"error: {d / 'metrics.jsonl'} {said}" in one_line(r, "error"), r.stderr


@BOTH
def test_a_directory_named_metrics_jsonl_is_one_error_line(tmp_path, tool):
    (tmp_path / "metrics.jsonl").mkdir()
    r = cli(*tool, tmp_path)
    assert r.returncode == 2
    assert one_line(r, "error") == (
        f"error: {tmp_path / 'metrics.jsonl'} is a directory, not a metrics file: give "
        f"the job.out_dir of a run, or move {tmp_path / 'metrics.jsonl'} aside\n"
    )


@BOTH
def test_a_step_number_far_beyond_the_records_is_counted_not_walked_to(tmp_path, tool):
    # step 10**15 after step 3: a gap the chain names by its first steps (was: a walk over every number up to it)
    d = run_dir(tmp_path, lines(*GOOD, step(1004.0, 10**15)))
    r = cli(*tool, d)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@BOTH
def test_a_damaged_config_toml_is_no_traceback(tmp_path, tool):
    d = run_dir(tmp_path, lines(*GOOD))
    (d / "config.toml").write_text("[train]\nsteps = [1]\n[checkpoint]\ndir = 5\n")
    r = cli(*tool, d)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no total steps: shown as unknown


# ---------------------------------------------------------------------------------------- the timeline PNG
def png_warning(r: subprocess.CompletedProcess, png: Path, why: str) -> None:
    assert r.returncode == 0, r.stderr
    assert one_line(r, "warning") == (
        f"warning: the timeline cannot be written to {png} ({why}): give --png PATH "
        f"(a writable .png file), or --no-png\n"
    )


def test_an_unwritable_default_png_still_prints_the_ledger_then_one_warning(tmp_path):
    # root writes into a read-only directory, so the run directory's goodput.png is made a directory instead:
    # a path no user, root included, can write a file to
    d = run_dir(tmp_path, lines(*GOOD))
    (d / "goodput.png").mkdir()
    r = cli("training.goodput", d)
    png_warning(r, d / "goodput.png", "Is a directory")
    assert r.stdout.startswith(f"goodput ledger of {d}: step 3") and "uninterrupted estimate" in r.stdout
    assert "timeline:" not in r.stdout


def test_a_png_path_under_a_file_is_one_warning_and_json_names_no_timeline(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    (tmp_path / "a_file").write_text("")
    png = tmp_path / "a_file" / "t.png"
    r = cli("training.goodput", d, "--png", png, "--json")
    png_warning(r, png, "Not a directory")
    out = json.loads(r.stdout)
    assert out["timeline_png"] is None and out["step"] == 3


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a read-only directory: the tests above use paths that refuse root too"
)
def test_a_read_only_run_directory_is_one_warning(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    d.chmod(0o555)
    try:
        r = cli("training.goodput", d)
    finally:
        d.chmod(0o755)
    png_warning(r, d / "goodput.png", "Permission denied")


def test_records_matplotlib_cannot_plot_are_one_warning_after_the_ledger(tmp_path):
    # a start-up clock 10**300 s after the epoch is a finite number, so a record; the picture has no axis for it
    d = run_dir(tmp_path, lines(start(1000.0, startup={"exec_time": 1e300}), *GOOD[1:]))
    r = cli("training.goodput", d)
    assert r.returncode == 0 and r.stdout.startswith(f"goodput ledger of {d}: step 3"), r.stderr
    warning = one_line(r, "warning")
    assert warning.startswith("warning: the timeline cannot be drawn (") and warning.endswith(
        "the records hold values it cannot plot; --no-png leaves it out\n"
    ), warning


def test_a_writable_png_is_written_after_the_ledger(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    r = cli("training.goodput", d)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[-1] == f"timeline: {d / 'goodput.png'}"
    assert (d / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_make_status_draws_no_png(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    assert cli("tools.status", d).returncode == 0
    assert sorted(p.name for p in d.iterdir()) == ["metrics.jsonl"]


# ---------------------------------------------------------------------------------- make status ARGS=RUN_DIR
def make_status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "status", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )


def test_make_status_takes_the_run_directory_itself_as_args(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    for args in (f"ARGS={d}", f"ARGS=--job.out_dir {d}"):
        r = make_status(args)
        assert r.returncode == 0 and r.stderr == "", (args, r.stderr)
        assert r.stdout.startswith(f"job      {d} (local): not running (unfinished)\n"), (args, r.stdout)


def test_make_status_with_a_run_directory_and_more_args_is_one_line(tmp_path):
    d = run_dir(tmp_path, lines(*GOOD))
    r = subprocess.run(
        ["scripts/status.sh", str(d), "--preset", "debug"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert one_line(r, "error") == (
        f'error: ARGS="{d} --preset debug": give the run directory alone (ARGS={d}) or '
        f'training arguments (ARGS="--job.out_dir {d} ..."), not both\n'
    )


def test_make_status_of_a_missing_run_directory_names_it(tmp_path):
    r = subprocess.run(
        ["scripts/status.sh", str(tmp_path / "nope")], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2
    assert one_line(r, "error").startswith(
        f"error: run directory {tmp_path / 'nope'} does not exist: give the run's job.out_dir"
    )

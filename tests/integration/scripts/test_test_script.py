"""scripts/test.sh (make test): the suite on TEST_WORKERS pytest-xdist workers, a file's tests on one worker;
what several files share is made once, under a lock."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.conftest import ROOT
from tests.support.file_order import load_seconds

ENV = {k: v for k, v in os.environ.items() if k != "TEST_WORKERS"}


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scripts/test.sh", *args], cwd=ROOT, env=ENV | env, capture_output=True, text=True, timeout=300
    )


def test_a_bad_worker_count_is_named_with_the_fix():
    r = run("tests/integration/scripts/test_make_help.py", TEST_WORKERS="two")
    assert r.returncode == 2 and "TEST_WORKERS=two: give a whole number of workers (0 = no workers)" in r.stderr


def workers_by_file(stdout: str) -> dict[str, set[str]]:
    """From `pytest -v` on xdist workers ("[gw0] [ 50%] PASSED tests/x.py::test_y"): file -> the workers that ran it."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"^\[(gw\d+)\].*?(?:PASSED|FAILED|SKIPPED|ERROR) (\S+?)::", stdout, re.M):
        out.setdefault(m.group(2), set()).add(m.group(1))
    return out


def test_the_suite_runs_on_three_workers_by_default_and_in_one_process_on_request():
    r = run("-p", "no:cacheprovider", "tests/integration/scripts/test_make_help.py")
    assert r.returncode == 0 and "3 passed" in r.stdout and "created: 3/3 workers" in r.stdout, r.stdout + r.stderr
    assert "slowest 25 durations" in r.stdout  # every run says where its time went
    r = run("-p", "no:cacheprovider", "tests/integration/scripts/test_make_help.py", TEST_WORKERS="0")
    assert r.returncode == 0 and "3 passed" in r.stdout and "workers" not in r.stdout, r.stdout


def test_a_files_tests_stay_on_one_worker():
    # files of several tests each that import little: every worker collects all of them (test_cluster_facts.py, here
    # before, cost each worker 8 s of imports and a meta-device t5-3b: most of this test's minute on a loaded machine)
    files = [
        "tests/unit/slurm/test_chaos_unit.py",
        "tests/unit/failover/test_launch.py",
        "tests/integration/scripts/test_make_help.py",
        "tests/unit/repo/test_file_order.py",
    ]
    r = run("-v", "-p", "no:cacheprovider", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = workers_by_file(r.stdout)
    assert set(ran) == set(files), ran
    assert all(len(w) == 1 for w in ran.values()), ran  # never split: a module's fixtures are built once
    assert len(set().union(*ran.values())) >= 2, ran  # and the files were shared among the workers


def test_tests_that_run_make_work_under_make_test_with_args():
    # make test ARGS=--durations=5: the suite's ARGS must not reach the make a test runs (it did, as a training
    # option of that make's `make status`: "unknown option --durations")
    env = {k: v for k, v in ENV.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "ARGS")}
    r = subprocess.run(
        [
            "make",
            "-s",
            "test",
            "TEST_WORKERS=0",
            "ARGS=--durations=5 -q -p no:cacheprovider "
            "tests/integration/scripts/test_make_help.py::test_a_make_that_a_test_runs_gets_no_variable_of_the_make_running_the_suite",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_a_tier_runs_its_folder_and_every_run_ends_with_a_line_per_tier():
    # make test-unit / test-fast pass --tier; an unknown tier is named, not handed to pytest as a file
    r = run("--tier", "fast")
    assert r.returncode == 2 and "--tier fast: give unit, integration or e2e" in r.stderr
    # only tests/unit/repo collected (the tier's folder is still what the script passes): collecting the whole unit
    # tier in one process, to select one test, took most of this test's time (20 s of imports under load)
    r = run(
        "--tier",
        "unit",
        "-q",
        "-p",
        "no:cacheprovider",
        "--ignore-glob=tests/unit/[!r]*",
        "-k",
        "test_resolving_refuses_a_stale_name",
        TEST_WORKERS="0",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^tier unit: 1 passed in [\d.]+ s of test time$", r.stdout, re.M), r.stdout
    assert "tier integration" not in r.stdout and "tier e2e" not in r.stdout


def test_files_are_handed_out_longest_first_and_a_run_can_record_their_seconds(tmp_path):
    files = ["tests/integration/scripts/test_make_exit_codes.py", "tests/integration/scripts/test_make_help.py"]
    known = load_seconds()
    short, long = sorted(files, key=lambda f: known.get(f, 0.0))  # as tests/file_seconds.json has them
    table = tmp_path / "seconds.json"
    r = run("-v", "-p", "no:cacheprovider", short, long, TEST_WORKERS="0", T5_FILE_SECONDS=str(table))
    assert r.returncode == 0, r.stdout + r.stderr
    ran = re.findall(r"^(tests/\S+?)::\S+ PASSED", r.stdout, re.M)
    assert ran and ran[0] == long and ran[-1] == short, ran
    seconds = json.loads(table.read_text())
    assert set(seconds) == {short, long} and all(v >= 0 for v in seconds.values()), seconds

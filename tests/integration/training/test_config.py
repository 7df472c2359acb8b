"""Config precedence and validation: bad values fail fast with a message naming the value and the fix."""

import subprocess
import sys

import pytest

from training.config import ConfigError, load_config


def test_cli_reports_bad_config_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "training", "--train.lr", "-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "train.lr=-1.0 must be > 0" in r.stderr


def test_help_documents_every_field():
    r = subprocess.run([sys.executable, "-m", "training", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for flag in ("--checkpoint.async_save", "--parallel.train_timeout_s", "--data.source", "--fault.slow_commit_s"):
        assert flag in r.stdout
    assert "Process-group timeout after the first step" in r.stdout


def test_abbreviations_are_refused_and_the_closest_flag_suggested():
    with pytest.raises(ConfigError, match=r"unknown option --train.step; did you mean --train.steps\?"):
        load_config(["--train.step", "5"])
    r = subprocess.run([sys.executable, "-m", "training", "--chekpoint.interval", "5"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: unknown option --chekpoint.interval; did you mean --checkpoint.interval?"
    ]


def test_help_shows_the_values_the_chosen_preset_runs_with():
    r = subprocess.run(
        [sys.executable, "-m", "training", "--preset", "t5-large", "--help"], capture_output=True, text=True
    )
    flat = " ".join(r.stdout.split())
    assert "(t5-large: 1024)" in flat and "(t5-large: 'bf16')" in flat  # d_model, precision of that preset
    assert "JobConfig(" not in r.stdout  # no dataclass reprs as group descriptions


def test_print_config_round_trips_through_config(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "training", "--preset", "t5-small", "--train.lr", "0.002", "--print-config"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    f = tmp_path / "resolved.toml"
    f.write_text(r.stdout)
    again = load_config(["--preset", "t5-small", "--config", str(f)])
    assert again.to_dict() == load_config(["--preset", "t5-small", "--train.lr", "0.002"]).to_dict()


def test_cli_refuses_a_timeout_that_overflows_in_one_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "--parallel.train_timeout_s",
            "1e15",
            "--train.steps",
            "1",
            "--job.out_dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert not (tmp_path / "run").exists()
    assert r.stderr == (
        "error: parallel.train_timeout_s=1e+15 must be at most 604800 s (7 days): longer waits "
        "overflow Python's and torch's timers; use --parallel.train_timeout_s 604800 or less\n"
    )

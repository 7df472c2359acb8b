"""checkpoint.memory_interval (auto, a number, 0) and checkpoint.memory_budget: parsed from the CLI and TOML, bad
values refused in one line that names the value and the fix, and the resolved TOML reads back the same."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from training.config import ConfigError, load_config, to_toml


def test_auto_is_the_default_and_numbers_stay_numbers():
    c = load_config([]).checkpoint
    assert c.memory_interval == "auto" and c.memory_budget == 0.02
    assert load_config(["--checkpoint.memory_interval", "3"]).checkpoint.memory_interval == 3
    assert load_config(["--checkpoint.memory_interval", "0"]).checkpoint.memory_interval == 0
    assert load_config(["--checkpoint.memory_interval", "Auto"]).checkpoint.memory_interval == "auto"


def test_toml_takes_a_number_or_auto_and_the_resolved_config_reads_back(tmp_path):
    for value, want in (("4", 4), ('"auto"', "auto")):
        f = tmp_path / "c.toml"
        f.write_text(f"[checkpoint]\nmemory_interval = {value}\nmemory_budget = 0.05\n")
        cfg = load_config(["--config", str(f)])
        assert (cfg.checkpoint.memory_interval, cfg.checkpoint.memory_budget) == (want, 0.05)
        back = tmp_path / "back.toml"
        back.write_text(to_toml(cfg))
        assert load_config(["--config", str(back)]).checkpoint.memory_interval == want


@pytest.mark.parametrize("value", ["fast", "-1", "2.5"])
def test_a_bad_interval_is_named_with_the_fix(value):
    with pytest.raises(
        ConfigError,
        match=re.escape(f"checkpoint.memory_interval='{value}' is not valid: use auto")
        if value != "-1"
        else re.escape("checkpoint.memory_interval=-1 is not valid: use auto"),
    ):
        load_config(["--checkpoint.memory_interval", value])


@pytest.mark.parametrize("value", ["0", "1", "-0.1", "1.5"])
def test_a_budget_outside_0_1_is_refused(value):
    with pytest.raises(
        ConfigError, match=re.escape(f"checkpoint.memory_budget={float(value)} must be above 0 and below 1")
    ):
        load_config(["--checkpoint.memory_budget", value])


def test_the_cli_says_it_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "training", "--checkpoint.memory_interval", "fast", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "checkpoint.memory_interval='fast' is not valid" in lines[0]
    assert "--checkpoint.memory_interval auto" in lines[0]

"""Slurm chaos harness without a cluster: settings, log tailing, and its verdicts on hand-made observations."""

from __future__ import annotations

import pytest


def _slurm_chaos(*argv: str, **env: str):
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k not in ("NODES", "SPARES")}
    return subprocess.run(
        [sys.executable, "-m", "chaos.slurm", *argv], env={**base, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "env, line",
    [
        ({"NODES": "abc"}, "error: NODES='abc' is not a whole number >= 1: set it to a count, or unset it"),
        ({"SPARES": "x"}, "error: SPARES='x' is not a whole number >= 0: set it to a count, or unset it"),
    ],
)
def test_make_chaos_tests_node_and_spare_counts_are_checked_in_one_line(env, line):
    # NODES=abc was int()'s traceback while the parser was built; SPARES was never read on Slurm
    r = _slurm_chaos("--list", **env)
    assert r.returncode == 2 and r.stderr.splitlines() == [line], r.stderr


def test_spares_is_the_slurm_chaos_tests_hot_spare_count():
    # the --slow-percent 0 behind it stops the run either way (exit 2, nothing started): with SPARES read, the
    # spare check (before it) answers; with SPARES ignored (the default 1 spare), the slow-percent check does
    r = _slurm_chaos("--scenarios", "node-kill", "--slow-percent", "0", SPARES="0")
    assert r.returncode == 2 and "only with a hot spare" in r.stderr, r.stderr
    r = _slurm_chaos("--scenarios", "node-kill", "--slow-percent", "0", "--spares", "1", SPARES="0")
    assert r.returncode == 2 and "--slow-percent 0" in r.stderr, r.stderr  # the flag wins over SPARES

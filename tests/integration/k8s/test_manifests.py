"""Rendered TrainJob/runtime validate against the pinned Trainer API models; bad inputs fail clearly."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize("var, value", [("NODES", "x"), ("SPARES", "-1"), ("NPROC", "0")])
def test_a_bad_size_variable_is_named_not_a_traceback(var, value):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("NODES", "SPARES", "NPROC")}
    r = subprocess.run(
        [sys.executable, "-m", "tools.k8s.submit", "--dry-run"],
        env={**env, var: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and f"error: {var}='{value}' is not a whole number" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr

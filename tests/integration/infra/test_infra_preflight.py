"""make preflight: the real decision code (AZ choice, reservation and quota checks, what it saves) against botocore's
Stubber (AWS cannot be reached here; the stub also checks every request against the real API model), and the
offline run: what it would check, one error line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.infra import ROOT


def test_without_credentials_it_says_what_it_would_check_and_exits_with_one_error_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        PLATFORM="parallelcluster",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "stacks.preflight"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "would check" in proc.stderr and "describe-instance-type-offerings" in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: no AWS credentials: configure them (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY), then rerun make preflight"
    ]


@pytest.mark.parametrize("platform", ["k8s"])
def test_a_bad_platform_is_a_configuration_error(platform: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stacks.preflight"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PLATFORM": platform},
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: PLATFORM=k8s: preflight supports PLATFORM=eks or PLATFORM=parallelcluster"

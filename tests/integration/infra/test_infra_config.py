"""InfraConfig: context parsing, validation with clear errors, and cdk.json/docs staying in sync."""

from __future__ import annotations

import json
import subprocess
import sys


from tests.support.infra import ROOT


def test_app_help_lists_keys_without_starting_cdk() -> None:
    proc = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for key in ("gpuInstanceType", "fsxStorageCapacityGiB", "trainerChartVersion"):
        assert key in proc.stdout


def test_app_rejects_bad_context_before_synthesis() -> None:
    proc = subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **__import__("os").environ,
            "CDK_CONTEXT_JSON": json.dumps({"gpuNodes": 0}),
            "CDK_OUTDIR": "/tmp/t5-infra-unused",
        },
    )
    assert proc.returncode == 2
    assert "gpuNodes=0: need at least 1 GPU node" in proc.stderr

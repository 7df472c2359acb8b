"""`make image` pushes to the saved deployment's repository: the storage stack of the saved namePrefix in the saved
region (cdk.context.json, as `make deploy` saved them), unless --stack / --region say otherwise. Run from a scratch
project root whose cdk.context.json is the test's; the AWS CLI is a recorder on PATH that answers the stack
lookup, docker one that accepts the build (no AWS, no Docker here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.integration.infra.test_infra_image_tag_chain import scratch_root
from tools.image_tag import source_tag

REPO = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/demo/t5-train"


def recording_tools(bindir: Path, calls: Path) -> dict[str, str]:
    """aws: every call's arguments appended to ``calls``; describe-stacks answers REPO, describe-images "not
    found", get-login-password a token. docker: accepts everything."""
    bindir.mkdir()
    (bindir / "aws").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'case "$*" in *describe-stacks*) echo {REPO} ;; *describe-images*) exit 254 ;; '
        "*get-login-password*) echo TOKEN ;; esac\n"
    )
    (bindir / "docker").write_text("#!/bin/sh\ncat >/dev/null 2>&1 || true\nexit 0\n")
    for tool in ("aws", "docker"):
        (bindir / tool).chmod(0o755)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("IMAGE_TAG", "DRY_RUN", "STACK")
    }
    return {**env, "PATH": f"{bindir}:{os.environ['PATH']}", "AWS_REGION": "us-east-1"}


def image(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(root / "scripts/image.sh"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_make_image_pushes_to_the_saved_prefix_in_the_saved_region(tmp_path: Path) -> None:
    root = scratch_root(tmp_path, {"namePrefix": "demo", "region": "eu-west-1"})
    calls = tmp_path / "aws-calls"
    env = recording_tools(tmp_path / "bin", calls)  # the shell's region is another one
    proc = image(root, env)
    assert proc.stdout.strip().splitlines()[-1] == f"{REPO}:{source_tag()}"
    lookups = [c for c in calls.read_text().splitlines() if "describe-stacks" in c]
    assert lookups == [
        "cloudformation describe-stacks --region eu-west-1 --stack-name demo-storage --query "
        "Stacks[0].Outputs[?OutputKey=='EcrRepositoryUri'].OutputValue --output text"
    ]
    assert all("--region eu-west-1" in c for c in calls.read_text().splitlines() if "ecr " in c), calls.read_text()
    # the dry run names the same stack, offline
    dry = image(root, env, "--dry-run")
    assert f"docker push <EcrRepositoryUri of demo-storage>:{source_tag()}" in dry.stdout
    assert "aws ecr get-login-password --region eu-west-1 |" in dry.stdout


def test_flags_and_environment_win_over_the_saved_settings_in_their_order(tmp_path: Path) -> None:
    root = scratch_root(tmp_path, {"namePrefix": "demo", "region": "eu-west-1"})
    env = recording_tools(tmp_path / "bin", tmp_path / "aws-calls")
    dry = image(root, env, "--dry-run", "--stack", "other-storage", "--region", "ap-south-1")
    assert "<EcrRepositoryUri of other-storage>" in dry.stdout and "--region ap-south-1 |" in dry.stdout
    dry = image(root, {**env, "STACK": "env-storage"}, "--dry-run")
    assert "<EcrRepositoryUri of env-storage>" in dry.stdout and "--region eu-west-1 |" in dry.stdout
    # nothing saved: cdk.json's prefix, and the shell's region
    dry = image(scratch_root(tmp_path / "fresh"), env, "--dry-run")
    assert "<EcrRepositoryUri of t5ft-storage>" in dry.stdout and "--region us-east-1 |" in dry.stdout


def test_a_broken_saved_file_is_named_before_anything_runs(tmp_path: Path) -> None:
    root = scratch_root(tmp_path, {"namePrefix": "Bad Prefix"})
    env = recording_tools(tmp_path / "bin", tmp_path / "aws-calls")
    proc = subprocess.run(
        [str(root / "scripts/image.sh"), "--dry-run"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "namePrefix" in proc.stderr and "docker" not in proc.stdout, proc.stderr

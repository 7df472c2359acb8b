"""Training image recipe and `make image` (the build itself needs Docker + AWS: only its offline paths run)."""
from __future__ import annotations

import os
import re
import subprocess

from tests.infra.support import ROOT

DOCKERFILE = ROOT / "cluster_assets" / "docker" / "Dockerfile"
IMAGE_SH = ROOT / "scripts" / "image.sh"


def test_dockerfile_pins_the_dlc_base_by_full_tag_and_keeps_its_torch() -> None:
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.M)
    assert re.fullmatch(r"[\w./-]+/pytorch-training:\d+\.\d+\.\d+-gpu-py3\d+-cu\d+-ubuntu\d+\.\d+-ec2", base), base
    assert "FROM ${BASE_IMAGE}" in text
    assert "COPY training/" in text
    assert "COPY cluster_facts/" in text  # training.launch imports it
    # torch comes from the DLC (CUDA build); the project's requirements pin the CPU wheel.
    assert re.search(r"grep -vE '\^\(torch\|", text) and "-c /tmp/constraints.txt" in text


def test_image_script_dry_run_works_offline() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([str(IMAGE_SH), "--dry-run", "--tag", "test-1", "--stack", "demo-storage"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "docker build --platform linux/amd64 -t <EcrRepositoryUri of demo-storage>:test-1" in proc.stdout
    assert "docker push <EcrRepositoryUri of demo-storage>:test-1" in proc.stdout


def test_image_script_explains_missing_tools(tmp_path) -> None:
    # A PATH with the basics but no docker: the script must say what is missing instead of failing later.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "git", "sed", "dirname", "mktemp", "cp", "find", "rm", "cat"):
        for d in ("/usr/bin", "/bin"):
            if os.path.exists(f"{d}/{tool}"):
                (bindir / tool).symlink_to(f"{d}/{tool}")
                break
    proc = subprocess.run([str(IMAGE_SH), "--tag", "t"], cwd=ROOT, env={"PATH": str(bindir), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "docker is not installed" in proc.stderr
    bad = subprocess.run([str(IMAGE_SH), "--tag", "bad tag!", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "not a valid image tag" in bad.stderr

"""Training image recipe and `make image` (the build itself needs Docker + AWS: only its offline paths run)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert re.search(r"docker build --platform linux/amd64 --label org.opencontainers.image.revision=\S+ "
                     r"-t <EcrRepositoryUri of demo-storage>:test-1 ", proc.stdout), proc.stdout
    assert "docker push <EcrRepositoryUri of demo-storage>:test-1" in proc.stdout


def test_make_image_pushes_the_tag_make_train_submits() -> None:
    # One tag, computed by tools/image_tag.py for both: `make image` pushes it, the EKS submit defaults to it.
    from tools.k8s.submit import build_parser  # noqa: PLC0415
    from tools.image_tag import TAG_PATTERN, source_tag  # noqa: PLC0415

    tag = source_tag()
    assert TAG_PATTERN.fullmatch(tag)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("IMAGE_TAG", "DRY_RUN")}
    proc = subprocess.run([str(IMAGE_SH), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"docker push <EcrRepositoryUri of t5ft-storage>:{tag}" in proc.stdout
    assert build_parser().parse_args([]).image_tag == tag


def test_image_tag_follows_the_build_context_only(tmp_path) -> None:
    from tools.image_tag import CONTEXT, copy_context, source_tag  # noqa: PLC0415

    copy = tmp_path / "repo"
    for name, rel in CONTEXT.items():  # a checkout with just the build context
        src, dst = ROOT / rel, copy / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    tag = source_tag(copy)
    assert tag == source_tag(ROOT)
    (copy / "README.md").write_text("docs do not enter the image")
    (copy / "training" / "__pycache__").mkdir(exist_ok=True)
    (copy / "training" / "__pycache__" / "x.pyc").write_bytes(b"byte code neither")
    assert source_tag(copy) == tag
    (copy / "training" / "config.py").write_text((copy / "training" / "config.py").read_text() + "\n# changed\n")
    changed = source_tag(copy)
    assert changed != tag
    ctx = tmp_path / "ctx"
    assert copy_context(ctx, copy) == changed
    assert (ctx / "Dockerfile").is_file() and (ctx / "training" / "config.py").is_file()
    assert not list(ctx.rglob("*.pyc")) and not (ctx / "README.md").exists()


def test_image_script_explains_missing_tools(tmp_path) -> None:
    # A PATH with the basics but no docker: the script must say what is missing instead of failing later.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "git", "sed", "dirname", "mktemp", "cp", "find", "rm", "cat"):
        for d in ("/usr/bin", "/bin"):
            if os.path.exists(f"{d}/{tool}"):
                (bindir / tool).symlink_to(f"{d}/{tool}")
                break
    (bindir / "python3").symlink_to(Path(sys.executable).resolve())  # the project needs Python anyway
    proc = subprocess.run([str(IMAGE_SH), "--tag", "t"], cwd=ROOT, env={"PATH": str(bindir), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "docker is not installed" in proc.stderr
    bad = subprocess.run([str(IMAGE_SH), "--tag", "bad tag!", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "not a valid image tag" in bad.stderr

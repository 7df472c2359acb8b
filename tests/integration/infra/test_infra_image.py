"""Training image recipe and `make image` (the build itself needs Docker + AWS: only its offline paths run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.infra import ROOT

DOCKERFILE = ROOT / "cluster_assets" / "docker" / "Dockerfile"
IMAGE_SH = ROOT / "scripts" / "image.sh"


def test_dockerfile_pins_the_dlc_base_by_full_tag_and_runs_the_tested_torch() -> None:
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.M)
    assert re.fullmatch(r"[\w./-]+/pytorch-training:\d+\.\d+\.\d+-gpu-py3\d+-cu\d+-ubuntu\d+\.\d+-ec2", base), base
    assert "FROM ${BASE_IMAGE}" in text
    assert "COPY training/" in text
    assert "COPY cluster_facts/" in text  # training.launch imports it
    # torch: the pinned version's CUDA build for the base's CUDA, installed before the other requirements, which
    # then keep it (the requirements pin the CPU wheel).
    (build,) = re.findall(r"^ARG TORCH_BUILD=(\S+)$", text, flags=re.M)
    assert build == re.search(r"-(cu\d+)-", base).group(1)
    align = text.index('RUN python /tmp/align_torch.py --requirements /tmp/requirements.txt --build "${TORCH_BUILD}"')
    assert align < text.index("-c /tmp/constraints.txt") and re.search(r"grep -vE '\^\(torch\|", text)


def _dist(root: Path, name: str, *requires: str) -> None:
    """An installed distribution's metadata, as pip leaves it in site-packages."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )


def test_align_torch_reads_the_pin_and_replaces_an_older_torch_and_what_was_built_for_it(tmp_path) -> None:
    from importlib import metadata  # noqa: PLC0415

    from cluster_assets.docker.align_torch import AlignError, pinned_torch, plan  # noqa: PLC0415

    requirements = (ROOT / "requirements.txt").read_text()
    import torch  # noqa: PLC0415 - the pin is the torch every test runs on

    assert pinned_torch(requirements) == torch.__version__.split("+")[0]
    # A base image's site-packages: a package pinned to its torch (torchvision does this), ones that accept any
    # recent torch, one that needs torch only for an extra.
    _dist(tmp_path, "vision", "torch==2.10.0")
    _dist(tmp_path, "loose", "torch>=2.6", "numpy")
    _dist(tmp_path, "optional", 'torch>=3 ; extra == "torch"')
    dists = list(metadata.distributions(path=[str(tmp_path)]))
    want = pinned_torch(requirements)
    index = "https://download.pytorch.org/whl/cu130"
    assert plan(requirements, "cu130", python="py", distributions=dists, have="2.10.0+cu130") == [
        ["py", "-m", "pip", "uninstall", "-y", "vision"],
        ["py", "-m", "pip", "install", "--no-cache-dir", f"torch=={want}+cu130", "--index-url", index],
    ]
    assert plan(requirements, "cu130", python="py", distributions=dists, have=f"{want}+cu130") == []  # as wanted
    # The pinned version as the CPU wheel (a project venv) is replaced by its CUDA build; nothing else is touched.
    without_vision = [d for d in dists if d.metadata["Name"] != "vision"]
    assert plan(
        requirements, "cu130", "file:///mirror", python="py", distributions=without_vision, have=f"{want}+cpu"
    ) == [["py", "-m", "pip", "install", "--no-cache-dir", f"torch=={want}+cu130", "--index-url", "file:///mirror"]]
    with pytest.raises(AlignError, match=r"one torch version as 'torch==X.Y.Z' \(found: 2.1.0, 2.2.0\)"):
        pinned_torch("torch==2.1.0+cpu ; sys_platform != 'darwin'\ntorch==2.2.0 ; sys_platform == 'darwin'\n")
    with pytest.raises(AlignError, match=r"found: none"):
        pinned_torch("numpy==2.0\n")


def test_align_torch_command_dry_run_and_bad_input() -> None:
    script = ROOT / "cluster_assets" / "docker" / "align_torch.py"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)

    reqs = str(ROOT / "requirements.txt")
    ok = run("--requirements", reqs, "--build", "cpu", "--dry-run")  # this venv holds the pinned CPU wheel
    assert ok.returncode == 0 and re.search(r"installed torch (\S+), wanted \1: nothing to do", ok.stdout), ok
    gpu = run("--requirements", reqs, "--dry-run")  # default: the CUDA build of the image's base
    assert gpu.returncode == 0 and "1 step(s)" in gpu.stdout
    assert re.search(
        r"pip install --no-cache-dir torch==\S+\+cu130 --index-url https://download.pytorch.org/whl/cu130", gpu.stdout
    ), gpu.stdout
    bad = run("--requirements", "missing.txt")
    assert bad.returncode == 2 and "--requirements missing.txt: no such file" in bad.stderr
    bad = run("--requirements", reqs, "--build", "cuda13")
    assert bad.returncode == 2 and "--build 'cuda13' is not a PyTorch build name; use e.g. cu130" in bad.stderr


def test_image_script_dry_run_works_offline() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [str(IMAGE_SH), "--dry-run", "--tag", "test-1", "--stack", "demo-storage"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(
        r"docker build --platform linux/amd64 --label org.opencontainers.image.revision=\S+ "
        r"-t <EcrRepositoryUri of demo-storage>:test-1 ",
        proc.stdout,
    ), proc.stdout
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
    for _name, rel in CONTEXT.items():  # a checkout with just the build context
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
    proc = subprocess.run(
        [str(IMAGE_SH), "--tag", "t"],
        cwd=ROOT,
        env={"PATH": str(bindir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "docker is not installed" in proc.stderr
    bad = subprocess.run(
        [str(IMAGE_SH), "--tag", "bad tag!", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "not a valid image tag" in bad.stderr
    # from the environment (make image IMAGE_TAG=...): the message names the variable the user set
    bad = subprocess.run(
        [str(IMAGE_SH), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "IMAGE_TAG": "bad tag!"},
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: IMAGE_TAG='bad tag!' is not a valid image tag"), (
        bad.stderr
    )


def test_align_torch_runs_in_a_bare_venv_the_way_scripts_venv_sh_starts_a_gpu_venv(tmp_path) -> None:
    # Only pip there (no packaging, no torch): the plan is one install, read with pip's own copy of packaging.
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import packaging"], capture_output=True).returncode != 0
    r = subprocess.run(
        [
            python,
            str(ROOT / "cluster_assets" / "docker" / "align_torch.py"),
            "--requirements",
            str(ROOT / "requirements.txt"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(
        r"installed torch none, wanted \S+\+cu130: 1 step\(s\)\n"
        r"\[align-torch\] \S+/bare/bin/python -m pip "
        r"install --no-cache-dir torch==\S+\+cu130 --index-url https://download.pytorch.org/whl/cu130",
        r.stdout,
    ), r.stdout

"""scripts/venv.sh: the torch build it keeps and the TORCH_BUILD values it refuses (no package is installed here)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "venv.sh")


def run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_BUILD", "TORCH_INDEX_URL", "VENV")}
    return subprocess.run(["bash", SCRIPT], env={**env, **env_extra}, capture_output=True, text=True, timeout=120)


def stamped_venv(path, build_suffix: str) -> None:
    """A venv (no pip: any install attempt fails) stamped as built from this requirements.txt."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    digest = hashlib.sha256((ROOT / "requirements.txt").read_bytes()).hexdigest()
    (path / ".requirements.sha256").write_text(digest + build_suffix + "\n")


def test_a_plain_call_keeps_the_build_the_venv_was_made_with(tmp_path):
    # make train/test call venv.sh without TORCH_BUILD: a CUDA venv on a cluster must stay CUDA, a CPU venv CPU.
    for suffix in ("+cu130", ""):
        venv = tmp_path / f"v{suffix or '-cpu'}"
        stamped_venv(venv, suffix)
        r = run({"VENV": str(venv)})
        assert r.returncode == 0 and r.stdout.strip() == f"{venv}/bin/python", r.stderr
        assert "installing" not in r.stderr
    # Asking for another build does reinstall (here it fails at once: this venv has no pip).
    r = run({"VENV": str(tmp_path / "v+cu130"), "TORCH_BUILD": "cpu"})
    assert r.returncode != 0 and "[venv] installing pinned requirements" in r.stderr


def test_a_bad_torch_build_is_refused_before_anything_is_created(tmp_path):
    r = run({"VENV": str(tmp_path / "new"), "TORCH_BUILD": "cuda13"})
    assert r.returncode == 2
    assert "TORCH_BUILD=cuda13 is not a PyTorch build; use cpu (the default) or a CUDA build such as cu130" in r.stderr
    assert not (tmp_path / "new").exists()


def fake_python(bindir, name: str, version: str) -> None:
    """An interpreter ``name`` in ``bindir`` that reports ``version`` and passes a ">= 3.11" check only if it is."""
    path = bindir / name
    major, minor = (int(x) for x in version.split(".")[:2])
    path.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python {version}"; exit 0; }}\n'
        f"exit {0 if (major, minor) >= (3, 11) else 1}\n"
    )
    path.chmod(0o755)


def pick(bindir, **env: str) -> subprocess.CompletedProcess:
    """`scripts/venv.sh --python` with only ``bindir`` (and dirname) on PATH."""
    (bindir / "dirname").symlink_to("/usr/bin/dirname")
    return subprocess.run(
        ["/bin/bash", SCRIPT, "--python"], env={"PATH": str(bindir), **env}, capture_output=True, text=True, timeout=60
    )


def test_the_newest_python_311_or_later_is_chosen_over_an_old_python3(tmp_path):
    # Amazon Linux 2023 (the ParallelCluster head node): python3 is 3.9, python3.11 comes from dnf
    fake_python(tmp_path, "python3", "3.9.16")
    fake_python(tmp_path, "python3.11", "3.11.9")
    r = pick(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "python3.11", r.stderr


def test_no_python_311_is_one_line_naming_the_fix(tmp_path):
    fake_python(tmp_path, "python3", "3.9.16")
    r = pick(tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert (
        r.stderr.startswith(
            "venv.sh: no Python 3.11 or newer on PATH (python3 is Python 3.9.16); install one "
            "(Amazon Linux 2023: sudo dnf install -y python3.11"
        )
        and len(r.stderr.splitlines()) == 1
    )


def test_python_too_old_is_refused(tmp_path):
    fake_python(tmp_path, "old", "3.9.16")
    r = pick(tmp_path, PYTHON=str(tmp_path / "old"))
    assert r.returncode == 2 and "is not a Python 3.11 or newer" in r.stderr


def test_a_venv_made_with_an_old_python_is_refused_with_the_fix(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    fake_python(venv / "bin", "python", "3.9.16")
    r = run({"VENV": str(venv)})
    assert r.returncode == 2 and f"{venv} was made with Python 3.9.16" in r.stderr and "rm -rf" in r.stderr

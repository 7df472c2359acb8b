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

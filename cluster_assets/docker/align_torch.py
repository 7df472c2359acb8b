"""Install the PyTorch version the project is tested with, as a CUDA build (image build and GPU venvs; stdlib + pip).

``requirements.txt`` pins the CPU wheel that every test runs on. A GPU machine needs the same version's CUDA
build, and the training image's base (AWS's PyTorch DLC) ships its own torch, whose version can lag the pin. The
two are not interchangeable: torch 2.10's torchrun has no ``--shutdown-timeout``, which every cluster job's launch
line passes, so a job on the DLC's torch fails before training starts. This script:

1. reads the pinned version from ``requirements.txt`` (``torch==2.13.0+cpu ; ...`` -> ``2.13.0``);
2. unless ``torch==<pin>+<build>`` is installed already, installs it from PyTorch's index for that build
   (``--build cu130``: https://download.pytorch.org/whl/cu130), keeping the base's CUDA, NCCL plugin and EFA;
3. first uninstalls what was built for the old torch and says so (a distribution whose declared torch
   requirement excludes the pin, e.g. torchvision and torchaudio pin their torch exactly): the job never imports
   them, and leaving them would leave broken imports behind;
4. fails unless ``import torch`` then reports ``<pin>+<build>``.

    python align_torch.py --requirements requirements.txt --build cu130            # the Dockerfile, venv.sh
    python align_torch.py --requirements requirements.txt --build cu130 --dry-run  # print what it would do
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable

PYTORCH_INDEX = "https://download.pytorch.org/whl"
_BUILD = re.compile(r"cu\d{3}|rocm\d+(?:\.\d+)*|cpu")
_PIN = re.compile(r"^torch==(\d+(?:\.\d+)*)(?:\+\w+)?\s*(?:;.*)?$")


class AlignError(Exception):
    """What is wrong and how to fix it (exit 2)."""


def pinned_torch(requirements: str) -> str:
    """The torch version ``requirements`` (a requirements.txt's text) pins, without its local tag (``+cpu``).
    Every torch line must pin the same version (the file has one per platform marker)."""
    versions = {m.group(1) for line in requirements.splitlines() if (m := _PIN.match(line.strip()))}
    if len(versions) != 1:
        found = ", ".join(sorted(versions)) or "none"
        raise AlignError(
            f"requirements.txt must pin one torch version as 'torch==X.Y.Z' (found: {found}); fix its torch lines"
        )
    return versions.pop()


def installed_torch() -> str | None:
    """The installed torch's full version (``2.10.0+cu130``), or None."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def incompatible_dependents(version: str, distributions: Iterable[metadata.Distribution]) -> list[str]:
    """Names of the distributions whose unconditional torch requirement excludes ``version`` (sorted)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # a bare venv: pip's own copy (only here: importing pip turns off setuptools' distutils)
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

    out = set()
    for dist in distributions:
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:  # another package's malformed metadata is not this script's business
                continue
            if req.name.lower() != "torch" or (req.marker and "extra" in str(req.marker)):
                continue
            if req.marker and not req.marker.evaluate():
                continue
            if not req.specifier.contains(version, prereleases=True):
                out.add(dist.metadata["Name"])
    return sorted(out)


def plan(
    requirements: str,
    build: str,
    index_url: str | None = None,
    python: str = sys.executable,
    distributions: Iterable[metadata.Distribution] | None = None,
    have: str | None = None,
) -> list[list[str]]:
    """The commands that make this Python's torch ``<pin>+<build>`` (empty when it is already); ``have``: the
    installed torch's full version, e.g. ``2.10.0+cu130`` (None: not installed)."""
    want = f"{pinned_torch(requirements)}+{build}"
    if have == want:
        return []
    dists = list(metadata.distributions() if distributions is None else distributions)
    commands = []
    if stale := incompatible_dependents(want.split("+")[0], dists):
        commands.append([python, "-m", "pip", "uninstall", "-y", *stale])
    commands.append(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            f"torch=={want}",
            "--index-url",
            index_url or f"{PYTORCH_INDEX}/{build}",
        ]
    )
    return commands


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="align_torch.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requirements", required=True, help="the project's requirements.txt (its torch pin)")
    ap.add_argument(
        "--build", default="cu130", help="PyTorch build: the base image's CUDA, e.g. cu130 (default: %(default)s)"
    )
    ap.add_argument("--index-url", help=f"wheel index holding that build (default: {PYTORCH_INDEX}/<build>)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    try:
        if not _BUILD.fullmatch(a.build):
            raise AlignError(f"--build {a.build!r} is not a PyTorch build name; use e.g. cu130, cu128 or cpu")
        path = Path(a.requirements)
        if not path.is_file():
            raise AlignError(f"--requirements {a.requirements}: no such file; pass the project's requirements.txt")
        want, have = f"{pinned_torch(path.read_text())}+{a.build}", installed_torch()
        commands = plan(path.read_text(), a.build, a.index_url, have=have)
        print(
            f"[align-torch] installed torch {have or 'none'}, wanted {want}: "
            + ("nothing to do" if not commands else f"{len(commands)} step(s)"),
            flush=True,
        )
        for cmd in commands:
            print("[align-torch] " + " ".join(cmd), flush=True)
            if not a.dry_run:
                subprocess.run(cmd, check=True)
        if not a.dry_run:
            now = subprocess.run(
                [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
            )
            if now.returncode or now.stdout.strip() != want:
                got = now.stdout.strip() or now.stderr.strip()[-300:]
                raise AlignError(
                    f"after alignment `import torch` gives {got!r}, not {want}; check that the index "
                    f"({a.index_url or PYTORCH_INDEX + '/' + a.build}) has torch {want}"
                )
            print(f"[align-torch] torch {want}", flush=True)
    except AlignError as e:
        print(f"align_torch.py: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"align_torch.py: {' '.join(e.cmd)} failed (exit {e.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

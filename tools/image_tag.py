"""The training image's build context and its tag: a digest of exactly what goes into the image.

``make image`` builds from this context and pushes ``<repository>:<tag>``; ``make train PLATFORM=eks`` submits
``<the runtime's repository>:<tag>`` of the same checkout. Both compute the tag here, so they agree without
anything being passed between them: the same code gives the same tag (an existing tag is not rebuilt; ECR tags
are immutable), changed code gives a new one, committed or not. Standard library only (scripts run it with the
system python3 before a venv exists)::

    python3 -m tools.image_tag                  # print the tag of this checkout, e.g. src-3f9c2a7b1d04
    python3 -m tools.image_tag --context DIR    # copy the build context into DIR (empty), print the tag
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Build context: name in the context -> path in the repository (a file, or a directory copied whole).
CONTEXT = {
    "Dockerfile": "cluster_assets/docker/Dockerfile",
    "requirements.txt": "requirements.txt",
    "align_torch.py": "cluster_assets/docker/align_torch.py",
    "training": "training",
    "cluster_facts": "cluster_facts",
}
#: What every tag looks like: "src-" and the first 12 hex digits of the context's SHA-256.
TAG_PATTERN = re.compile(r"src-[0-9a-f]{12}")
#: What Docker and ECR accept as a tag (IMAGE_TAG, --image-tag): up to 128 of these, not starting with '.' or '-'.
VALID_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_tag(tag: str, given_as: str) -> str:
    """``tag`` when Docker/ECR accept it; else ValueError naming where it came from (``given_as``) and the rule."""
    if not VALID_TAG.fullmatch(tag):
        raise ValueError(
            f"{given_as}={tag!r} is not a valid image tag: use up to 128 letters, digits, '_', '.' or "
            f"'-', not starting with '.' or '-' (e.g. v1.2), or unset it for this checkout's "
            f"{TAG_PATTERN.pattern.split('-')[0]}-<digest> tag"
        )
    return tag


def _skipped(path: Path) -> bool:
    """Byte code and hidden files (editor swap files, .DS_Store) never enter the image or its tag."""
    return path.name.startswith(".") or path.name == "__pycache__" or path.suffix == ".pyc"


def context_files(root: Path = ROOT) -> dict[str, Path]:
    """Name in the build context -> file in ``root``, for every file of the context, sorted by name."""
    files: dict[str, Path] = {}
    for name, rel in CONTEXT.items():
        src = root / rel
        if src.is_file():
            files[name] = src
            continue
        if not src.is_dir():
            raise FileNotFoundError(f"{src}: part of the training image's build context, missing in this checkout")
        for path in sorted(src.rglob("*")):
            if (
                path.is_file()
                and not any(_skipped(p) for p in path.relative_to(src).parents[:-1])
                and not _skipped(path)
            ):
                files[f"{name}/{path.relative_to(src).as_posix()}"] = path
    return dict(sorted(files.items()))


def source_tag(root: Path = ROOT) -> str:
    """The image tag of ``root``'s build context: ``src-`` + 12 hex digits of its SHA-256 (names and bytes)."""
    h = hashlib.sha256()
    for name, path in context_files(root).items():
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return f"src-{h.hexdigest()[:12]}"


def copy_context(dest: Path, root: Path = ROOT) -> str:
    """Copy the build context into ``dest`` and return its tag (computed from the same files)."""
    for name, path in context_files(root).items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return source_tag(root)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tools.image_tag", description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=Path, metavar="DIR", help="copy the build context into DIR first")
    a = p.parse_args(argv)
    try:
        print(copy_context(a.context) if a.context else source_tag())
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

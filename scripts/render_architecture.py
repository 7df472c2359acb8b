#!/usr/bin/env python3
"""Render docs/architecture/*.dot to PNG beside it with Graphviz, recording the source's sha256 in the PNG.

    scripts/render_architecture.py            # needs Graphviz's `dot` (Debian: apt-get install graphviz)

tests/unit/repo/test_architecture_doc.py compares the recorded hash with the source, so an edited diagram whose picture
was not rendered again fails the suite (CI has no Graphviz: it checks, it does not render).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

from PIL import Image, PngImagePlugin

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture"
HASH_KEY = "source-sha256"


def source_hash(dot: Path) -> str:
    return hashlib.sha256(dot.read_bytes()).hexdigest()


def render(dot: Path) -> Path:
    png = dot.with_suffix(".png")
    raw = subprocess.run(["dot", "-Tpng", "-Gdpi=110", str(dot)], check=True, capture_output=True).stdout
    info = PngImagePlugin.PngInfo()
    info.add_text(HASH_KEY, source_hash(dot))
    Image.open(io.BytesIO(raw)).save(png, pnginfo=info, optimize=True)
    return png


def main() -> int:
    if shutil.which("dot") is None:
        print(
            "error: Graphviz's `dot` is not installed; install it (Debian: apt-get install graphviz)", file=sys.stderr
        )
        return 2
    for dot in sorted(DOCS.glob("*.dot")):
        print(f"rendered {render(dot).relative_to(DOCS.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

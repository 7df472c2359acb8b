"""docs/architecture.md stays true: its picture is rendered from the source beside it (not an older one), and
every module it names exists."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def test_the_picture_is_rendered_from_its_current_source():
    for dot in sorted((ROOT / "docs" / "architecture").glob("*.dot")):
        png = dot.with_suffix(".png")
        assert png.is_file(), f"{png} missing: run scripts/render_architecture.py"
        recorded = Image.open(png).text.get("source-sha256")
        assert recorded == hashlib.sha256(dot.read_bytes()).hexdigest(), \
            f"{png.name} is older than {dot.name}: run scripts/render_architecture.py (needs Graphviz)"
        assert f"architecture/{png.name}" in DOC.read_text()


def test_the_readme_links_the_page_and_every_module_named_exists():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    text = DOC.read_text() + (ROOT / "docs" / "architecture" / "run_path.dot").read_text()
    named = set(re.findall(r"\btraining(?:\.[a-z_]+)+", text))
    assert len(named) > 10
    missing = [name for name in sorted(named) if not _exists(name)]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _exists(module: str) -> bool:
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

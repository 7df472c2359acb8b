"""`make help` lists every target and every variable the scripts read, with the default the scripts really use."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = ("PLATFORM", "PRESET", "NPROC", "NODES", "ARGS", "DRY_RUN", "IMAGE_TAG")


def make_help() -> str:
    proc = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_lists_targets_and_variables_with_default_and_meaning() -> None:
    out = make_help()
    targets = re.findall(r"^([a-z-]+):.*## ", (ROOT / "Makefile").read_text(), flags=re.M)
    assert {"train", "synth", "chaos-test", "image"} <= set(targets)
    for target in targets:
        assert re.search(rf"^{target}\t\S", out, flags=re.M), target
    rows = dict(re.findall(r"^  ([A-Z_]+) +(\S.*)$", out, flags=re.M))
    assert set(VARIABLES) <= set(rows), f"make help lacks {set(VARIABLES) - set(rows)}"
    for name in VARIABLES:
        default, meaning = rows[name].split(None, 1)
        assert default and len(meaning) > 30, (name, rows[name])
    # Every variable the Makefile exports to the scripts is documented.
    exported = re.search(r"^export (.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    assert set(exported) <= set(rows), set(exported) - set(rows)


def test_help_defaults_are_the_ones_the_local_train_script_uses() -> None:
    rows = dict(re.findall(r"^  ([A-Z_]+) +(\S+)", make_help(), flags=re.M))
    train = (ROOT / "scripts" / "train.sh").read_text()
    for name in ("PLATFORM", "PRESET", "NPROC", "NODES"):
        (default,) = re.findall(rf"\$\{{{name}:-([^}}]*)\}}", train)
        assert rows[name] == default, f"make help says {name}={rows[name]}, scripts/train.sh uses {default}"

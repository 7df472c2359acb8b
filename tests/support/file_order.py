"""The order in which pytest-xdist hands out test files: the longest first.

scripts/test.sh runs `--dist loadfile`: each worker takes the next file in collection order when it is free. In
the folders' order the suite's longest file (the Slurm lab's, ~9 minutes) started after most of the rest and ran on
alone at the end while the other worker idled. Handed out longest first (the classic longest-processing-time rule),
the short files fill the gaps at the end instead.

The seconds per file come from `tests/file_seconds.json`, written by a run with
`T5_FILE_SECONDS=tests/file_seconds.json` (setup, call and teardown summed per file). A file it does not list (a new
one) counts as its tier's typical file.
"""

from __future__ import annotations

import json
from pathlib import Path

SECONDS_FILE = Path(__file__).resolve().parents[1] / "file_seconds.json"
#: a file the table does not know yet: about the median file of its tier
TIER_DEFAULT_S = {"e2e": 60.0, "integration": 8.0, "unit": 0.5}


def load_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """`{"tests/e2e/...py": seconds}`; empty when the file is missing or not such a table (the order is a hint)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: float(v) for k, v in table.items() if isinstance(k, str) and isinstance(v, (int, float))}


def expected_seconds(rel_file: str, tier: str, seconds: dict[str, float]) -> float:
    return seconds.get(rel_file, TIER_DEFAULT_S.get(tier, 1.0))


def longest_first(files_in_order: list[str], weight: dict[str, float]) -> list[str]:
    """The unit tier's files first (a minute in all, and then no unit test runs in a worker after an integration
    test that may have left a thread behind: the unit tier's guard would blame the unit test for that thread's
    socket), then the others by expected seconds, longest first; ties keep the collection order."""
    position = {f: i for i, f in enumerate(files_in_order)}
    return sorted(files_in_order, key=lambda f: (not f.startswith("tests/unit/"), -weight[f], position[f]))


def merged(old: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """The table after a run: measured files updated, the others kept (a run of one tier keeps the rest)."""
    return dict(sorted((old | {k: round(v, 1) for k, v in measured.items()}).items()))

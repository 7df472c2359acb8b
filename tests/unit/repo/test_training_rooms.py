"""Inside ``training/``: one room per concern, imports flowing one way, no import circle (docs/architecture.md).

    config, errors, field_docs   what every room shares        (the "shared" modules)
    data/, model/                <- shared only
    checkpoint/                  <- shared only
    job/                         <- shared, data, model, checkpoint, goodput (with its entry point, __main__)
    launch/                      <- shared, job, checkpoint                (with its store, rdzv_store)
    goodput/                     <- shared only (arithmetic over metrics.jsonl; the chaos core imports it)
    the tools                    compare, compile_report, export, bench (and bench_copy), bench_hf, bench_init,
                                 bench_saves, batch_fit: any room

Every import counts, at any depth (function-level ones too), as in tests/unit/repo/test_import_layers.py. Each room's
``__init__`` docstring lists every module of the room.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.repo.test_import_layers import imported_modules

ROOT = Path(__file__).resolve().parents[3]
TRAINING = ROOT / "training"
SHARED = {"training", "training.config", "training.errors", "training.field_docs", "training.torch_private"}
COMMANDS = {
    "training.bench",
    "training.bench_copy",
    "training.bench_hf",
    "training.bench_init",
    "training.bench_saves",
    "training.batch_fit",
    "training.compare",
    "training.compile_report",
    "training.export",
}
#: Top-level modules that belong to a room: their command names (python -m training[.rdzv_store]) stay short.
IN_ROOM = {"training.__main__": "job", "training.rdzv_store": "launch"}
ROOMS = ("data", "model", "checkpoint", "job", "launch", "goodput")
ALLOWED = {
    "shared": set(),
    "data": set(),
    "model": set(),
    "checkpoint": set(),
    "job": {"data", "model", "checkpoint", "goodput"},
    "launch": {"job", "checkpoint"},
    "goodput": set(),
    "commands": {"data", "model", "checkpoint", "job", "launch", "goodput", "commands"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    if module in SHARED:
        return "shared"
    if module in COMMANDS:
        return "commands"
    if module in IN_ROOM:
        return IN_ROOM[module]
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ROOMS:
        return parts[1]
    raise AssertionError(f"{module} belongs to no room: add it to a room (or to SHARED/COMMANDS) and the docs")


def graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (resolved to an existing module: `from pkg import mod` counts)."""
    files = {module_name(p): p for p in TRAINING.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("training"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    targets.add(sub if sub in files else node.module)
        targets |= {
            m
            for _, m in imported_modules(tree, mod, path.name == "__init__.py")
            if m.startswith("training") and m in files
        }
        edges[mod] = {t for t in targets if t in files and t != mod}
    return edges


def test_every_module_is_in_a_room_and_imports_only_what_its_room_may():
    bad = []
    for mod, targets in sorted(graph().items()):
        room = room_of(mod)
        for t in sorted(targets):
            other = room_of(t)
            if other not in ("shared", room) and other not in ALLOWED[room]:
                bad.append(f"{mod} ({room}) imports {t} ({other})")
    assert not bad, "\n".join(bad)


def test_no_import_circle_inside_training():
    edges = graph()
    # package __init__ files re-export from their own modules: an edge into a package is an edge into what its
    # __init__ imports, so only circles between modules count
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not circles, "\n".join(circles)


@pytest.mark.parametrize("room", ROOMS)
def test_each_rooms_docstring_lists_all_its_modules(room):
    package = TRAINING / room
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing = [p.stem for p in sorted(package.glob("*.py")) if p.stem != "__init__" and p.stem not in doc]
    assert not missing, f"training/{room}/__init__.py does not mention {missing}"

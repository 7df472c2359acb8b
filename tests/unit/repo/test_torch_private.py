"""Canaries for training/torch_private.py: each private torch API the project uses still exists and behaves as the
project relies on. A failure here means a torch upgrade changed it: fix the one function in torch_private.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from training import torch_private

ROOT = Path(__file__).resolve().parents[3]


def test_torchrun_runs_as_the_agent_runs_it_through_public_pieces():
    """training.launch.agent._launch does what torchrun's ``run`` does, without replacing any of it: the rendezvous
    defaults, ``config_from_args``, then ``elastic_launch(config, entrypoint)(*args)``. A torch whose ``run`` does
    more (or other) stops here."""
    from torch.distributed import run as torchrun

    from training.launch.agent import _torchrun_rendezvous_defaults

    body = inspect.getsource(torchrun.run)
    assert "config, cmd, cmd_args = config_from_args(args)" in body
    assert "elastic_launch(" in body and "entrypoint=cmd" in body and ")(*cmd_args)" in body
    assert list(inspect.signature(torchrun.config_from_args).parameters) == ["args"]
    args = torchrun.parse_args(["--standalone", "--nproc-per-node=1", "-m", "training", "--preset", "debug"])
    _torchrun_rendezvous_defaults(args)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.master_port) == ("c10d", "localhost:0", 29500)
    config, cmd, cmd_args = torchrun.config_from_args(args)
    assert type(config).__name__ == "LaunchConfig" and config.rdzv_backend == "c10d" and isinstance(cmd_args, list)
    assert "training" in cmd_args and "--preset" in cmd_args  # what warm_workers.apply_warm_start rewrites


def test_default_store_is_the_default_groups_store(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        got = torch_private.default_store()
        base = got
        while isinstance(base, dist.PrefixStore):  # what the watchdog unwraps to reach the TCPStore's address
            base = base.underlying_store
        assert isinstance(base, dist.FileStore)
        got.set("canary", "1")
        assert got.get("canary") == b"1"
    finally:
        dist.destroy_process_group()


def test_dcp_loads_into_plain_tensors_without_a_process_group(tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=str(tmp_path), no_dist=True)
    sd: dict = {}
    torch_private.load_dcp_state_dict(sd, str(tmp_path))
    assert torch.equal(sd["model"]["w"], torch.arange(4.0))


def test_dispatch_mode_sees_ops_and_tree_map_maps_nested_args():
    mode_cls, tree_map = torch_private.dispatch_mode_and_tree_map()
    ops = []

    class Recorder(mode_cls):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func)
            return func(*args, **(kwargs or {}))

    with Recorder():
        torch.zeros(2).fill_(1.0)
    assert torch.ops.aten.fill_.Scalar in ops
    assert tree_map(lambda x: x * 2, (1, [2, {"a": 3}])) == (2, [4, {"a": 6}])


def test_no_private_torch_api_outside_the_inventory():
    """Only torch_private.py imports torch's underscore modules or names, or calls underscore attributes of torch
    (the membership on etcd replaces nothing of torch's)."""
    allowed = {"training/torch_private.py"}
    offenders = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
                if any(p.startswith("_") for p in node.module.split(".")) or any(
                    a.name.startswith("_") for a in node.names
                ):
                    offenders.append(f"{rel}:{node.lineno} from {node.module} import ...")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                chain = ast.unparse(node)
                if chain.startswith(("torch.", "dist.", "dr.", "torchrun.")):
                    offenders.append(f"{rel}:{node.lineno} {chain}")
    assert offenders == [], offenders


def torch_names(tree: ast.AST) -> set[str]:
    """The names a module binds to torch or a part of it (``import torch``, ``from torch.distributed import run as
    torchrun``, ``import torch.distributed as dist``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def torch_assignments(source: str) -> list[str]:
    """Assignments (``=``, ``+=``, ``setattr``, ``del``) to an attribute of torch: every one but a configuration flag
    (``torch.backends...``, ``....config.x``) replaces a piece of torch at run time."""
    tree = ast.parse(source)
    names = torch_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
        ):  # setattr(obj, "name", value) assigns obj.name
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "?"
            targets = [ast.Attribute(value=node.args[0], attr=str(name))]
        else:
            continue
        for target in targets:
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            chain = ast.unparse(target)
            if (
                isinstance(root, ast.Name)
                and root.id in names
                and target is not root
                and ".config." not in chain
                and ".backends." not in chain
            ):
                out.append(f"{node.lineno} {chain}")
    return out


def test_the_guard_catches_a_replaced_torch_attribute():
    assert torch_assignments("from torch.distributed import run as torchrun\ntorchrun.config_from_args = f\n") == [
        "2 torchrun.config_from_args"
    ]
    assert torch_assignments("import torch.distributed as dist\nsetattr(dist, 'barrier', f)\n") == ["2 dist.barrier"]
    assert (
        torch_assignments(
            "import torch\ntorch._dynamo.config.recompile_limit = 9\n"
            "torch.backends.cudnn.benchmark = False\nx = torch.ones(1)\nx.grad = None\n"
        )
        == []
    )


def test_nothing_of_torch_is_replaced_at_run_time():
    """No module assigns to a torch attribute other than a configuration flag (the warm workers' entrypoint used
    to replace ``torch.distributed.run.config_from_args``; training.launch.agent now calls the public pieces)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{hit}"
        for folder in ("training", "chaos", "tools", "testbed")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for hit in torch_assignments(path.read_text())
    ]
    assert offenders == [], offenders


def test_dynamo_recompile_limit_is_where_compile_sets_it():
    before = torch._dynamo.config.recompile_limit
    try:
        torch_private.raise_recompile_limit(before + 1)
        assert torch._dynamo.config.recompile_limit == before + 1
    finally:
        torch._dynamo.config.recompile_limit = before


def test_identical_workers_get_their_ranks_without_the_store(monkeypatch):
    """TORCH_ELASTIC_WORKER_IDENTICAL=1 (training.launch.commands.launch_env): the ranks come from the node's
    rendezvous rank alone; a store that fails on any use is not touched. Without the variable torchrun uses it."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

    class Unusable:
        def __getattr__(self, name):
            raise AssertionError(f"the store was used: {name}")

    spec = WorkerSpec(role="default", local_world_size=2, rdzv_handler=None, entrypoint="x")
    monkeypatch.setenv("TORCH_ELASTIC_WORKER_IDENTICAL", "1")
    workers = SimpleElasticAgent._assign_worker_ranks(None, Unusable(), 3, 5, spec)
    assert [(w.global_rank, w.world_size, w.role_rank, w.role_world_size) for w in workers] == [
        (6, 10, 6, 10),
        (7, 10, 7, 10),
    ]
    monkeypatch.delenv("TORCH_ELASTIC_WORKER_IDENTICAL")
    with pytest.raises(AssertionError, match="the store was used"):
        SimpleElasticAgent._assign_worker_ranks(None, Unusable(), 3, 5, spec)


def test_flex_attention_reference_is_flex_attention_with_a_gradient_for_the_score_mod_buffer():
    """The HOP's reference computes what the public flex_attention computes (forward, no grad: the public one runs
    on the CPU then), and differentiates like the dense attention it stands for, the score_mod's buffer included."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))
    bias = torch.randn(1, 3, 16, 16, generator=g)
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 16, 16, device="cpu")

    def mod(score, b, h, i, j, bias):
        return score + bias[0, h, i, j]

    public = flex_attention(
        q, k, v, score_mod=lambda s, b, h, i, j: mod(s, b, h, i, j, bias), block_mask=mask, scale=1.0
    )
    inputs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = torch_private.flex_attention_reference(*inputs[:3], mod, (inputs[3],), mask, scale=1.0)
    torch.testing.assert_close(out, public)
    out.square().sum().backward()

    dense = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    scores = (dense[0] @ dense[1].transpose(-1, -2) + dense[3]).masked_fill(
        ~torch.ones(16, 16).tril().bool(), -torch.inf
    )
    (scores.softmax(-1) @ dense[2]).square().sum().backward()
    for got, want in zip(inputs, dense):
        torch.testing.assert_close(got.grad, want.grad)


def test_dynamo_explain_counts_a_break_and_the_graph_counter_counts_compiles():
    def one_break(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    graphs, breaks, reasons = torch_private.dynamo_explain(one_break, torch.ones(2))
    assert (graphs, breaks) == (2, 1) and len(reasons) == 1 and reasons[0]
    torch.compiler.reset()
    before = torch_private.dynamo_graphs_compiled()
    torch.compile(lambda x: x.sin() + 1, backend="eager")(torch.ones(3))
    assert torch_private.dynamo_graphs_compiled() == before + 1


def test_scale_in_place_multiplies_every_tensor_by_the_scalar_tensor_in_place():
    import torch

    from training.torch_private import scale_in_place

    a, b = torch.ones(3), torch.full((2, 2), 2.0)
    views = [a[:2], b]
    scale_in_place(views, torch.tensor(0.5))
    assert a.tolist() == [0.5, 0.5, 1.0] and b.tolist() == [[1.0, 1.0], [1.0, 1.0]]  # through views, in place
    scale_in_place([], torch.tensor(2.0))  # nothing to scale

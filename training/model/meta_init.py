"""Build a model on the meta device and give each rank only its shard, with the weights a CPU build would have.

A CPU build of t5-3b holds 12 GB of fp32 weights on every rank before ``fully_shard`` cuts them. Here the
model is built on the meta device (no memory) while a dispatch mode records every operation that writes
values: the random draws (HF's constructor and ``initialize_weights``) and the fills. After sharding,
:meth:`RecordedInit.materialize` allocates each rank's shards and replays the record in order: every random
draw runs on the CPU generator exactly as the CPU build ran it (same shapes, same arguments, same order, so
the same numbers), one full tensor at a time, and only this rank's slice of a draw that ends up in a
parameter is kept. So the weights are bitwise those of ``torch.manual_seed(seed); Model(config)`` for any
world size, and a rank's memory holds its shards plus one parameter.

    record = record_init(lambda: T5ForConditionalGeneration(config), seed=seed)
    model = record.model                 # on the meta device
    fully_shard(...)                     # FSDP2 shards meta parameters as they are
    record.materialize(model, device)    # to_empty + replay (allocate() + initialize())

Anything the replay could not reproduce exactly (a write into part of a parameter, an op other than a
random draw, fill or zero on one, a parameter nothing wrote, buffers) raises :class:`MetaInitUnsupported`
before training starts; :func:`training.model.t5.build_model_for_sharding` then builds on the CPU instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from training.torch_private import dispatch_mode_and_tree_map

TorchDispatchMode, tree_map = dispatch_mode_and_tree_map()

# In-place writes on a parameter that the replay applies to the local shard as they are.
_ELEMENTWISE_WRITES = {torch.ops.aten.fill_.Scalar, torch.ops.aten.zero_.default}


class MetaInitUnsupported(RuntimeError):
    """The recorded construction wrote a parameter in a way the per-shard replay cannot reproduce."""


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    target: torch.Tensor | None  # the tensor an in-place op writes (arg 0); None for factories

    @property
    def seeded(self) -> bool:
        return torch.Tag.nondeterministic_seeded in self.func.tags


class _Recorder(TorchDispatchMode):
    """Runs every op as usual (on meta tensors: shapes only) and keeps the ones that write values."""

    def __init__(self):
        super().__init__()
        self.ops: list[_Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(a.name == "device" for a in func._schema.arguments):
            # A factory (torch.empty, torch.ones, ...): make it on the meta device. Done here rather than with
            # `torch.device("meta")` because transformers skips weight init under that context, and a CPU
            # build runs it inside the constructor (each T5Stack's post_init), between construction draws.
            kwargs = {**kwargs, "device": torch.device("meta")}
        writes = func._schema.is_mutable
        if writes or torch.Tag.nondeterministic_seeded in func.tags:
            # The op keeps its tensors alive, so no later tensor can reuse a recorded one's id.
            target = args[0] if writes and args and isinstance(args[0], torch.Tensor) else None
            self.ops.append(_Op(func, args, kwargs, target))
        return func(*args, **kwargs)


@dataclass
class RecordedInit:
    """A model on the meta device and the value-writing ops of its construction, in order."""

    model: torch.nn.Module
    seed: int
    ops: list[_Op]
    names: dict[int, str] = field(default_factory=dict)  # id(meta parameter) -> its (first) name
    tied: dict[str, list[str]] = field(default_factory=dict)  # first name -> the other names of that parameter

    def check(self) -> None:
        """Raise MetaInitUnsupported unless the replay reproduces every parameter exactly."""
        if next(self.model.buffers(), None) is not None:
            raise MetaInitUnsupported("the model has buffers, which the replay does not restore")
        written = set()
        for op in self.ops:
            if op.target is None:
                continue
            base = op.target._base
            if base is not None and id(base) in self.names:
                raise MetaInitUnsupported(f"{op.func} writes part of {self.names[id(base)]}")
            if id(op.target) not in self.names:
                continue
            if not (op.seeded or op.func in _ELEMENTWISE_WRITES):
                raise MetaInitUnsupported(
                    f"{op.func} on {self.names[id(op.target)]} is neither a random draw nor a fill"
                )
            written.add(id(op.target))
        missing = [n for i, n in self.names.items() if i not in written]
        if missing:
            raise MetaInitUnsupported(f"nothing writes {', '.join(missing[:3])}: their value comes from a factory")

    def materialize(self, model: torch.nn.Module, device: torch.device) -> None:
        """Allocate `model`'s (sharded) parameters on `device` and fill them by replaying the record.
        `model` is :attr:`model`, possibly wrapped or sharded since (parameter names unchanged)."""
        self.allocate(model, device)
        self.initialize(model)

    def allocate(self, model: torch.nn.Module, device: torch.device) -> None:
        """`model`'s (sharded) parameters on `device`, their values undefined until :meth:`initialize` or a
        restore writes every one of them."""
        model.to_empty(device=device)
        for name, others in self.tied.items():
            # Module.to_empty gives each module its own new parameter (FSDP2 keeps shared ones shared).
            for other in others:
                owner, _, attr = other.rpartition(".")
                setattr(model.get_submodule(owner), attr, model.get_parameter(name))

    @torch.no_grad()
    def initialize(self, model: torch.nn.Module) -> None:
        """Fill `model`'s allocated parameters by replaying the record: every random draw of the whole model runs
        on the CPU generator, whatever the rank's share (t5-large: ~18 s on one core), so a start that restores
        its state skips it. Reseeds the CPU generator (to the job's seed, as the CPU build does)."""
        params = {i: model.get_parameter(name) for i, name in self.names.items()}
        torch.manual_seed(self.seed)
        for op in self.ops:
            param = params.get(id(op.target))
            if op.seeded:
                full = _run_on_cpu(op)
                if param is not None:
                    _local(param).copy_(_my_slice(full, param))
            elif param is not None:
                op.func(_local(param), *op.args[1:], **op.kwargs)


def record_init(build: Callable[[], torch.nn.Module], *, seed: int) -> RecordedInit:
    """Run `build()` under the recorder, after ``torch.manual_seed(seed)`` as a CPU build would, with every
    tensor it creates on the meta device; checks the record (MetaInitUnsupported)."""
    torch.manual_seed(seed)
    recorder = _Recorder()
    with recorder:
        model = build()
    names, tied = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = names.setdefault(id(p), name)
        if first != name:
            tied.setdefault(first, []).append(name)
    record = RecordedInit(model, seed, recorder.ops, names, tied)
    record.check()
    return record


def _run_on_cpu(op: _Op) -> torch.Tensor:
    """Run a recorded random op on real CPU tensors (advancing the CPU generator as the CPU build did);
    returns the tensor it wrote or created."""

    def real(x):
        if isinstance(x, torch.Tensor):
            if x is not op.target:
                raise MetaInitUnsupported(f"{op.func} reads a tensor whose values the replay does not have")
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        if isinstance(x, torch.device) and x.type == "meta":
            return torch.device("cpu")
        return x

    args, kwargs = tree_map(real, op.args), tree_map(real, op.kwargs)
    out = op.func(*args, **kwargs)
    return args[0] if op.target is not None else out


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _my_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full` under `param`'s sharding (no communication)."""
    if not isinstance(param, DTensor):
        return full
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()

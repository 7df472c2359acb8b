"""The trainer reads the step figures (loss, gradient norm) on the host only at read points (issue 51, lever 3):
a few steps of a real in-process Trainer (tiny T5, world of one, gloo) under a counter of host reads of the values
the model computed. Between read points nothing waits for the device; the non-finite guard still stops a run
before the checkpoint after a bad step, as it did when it read every step."""

from __future__ import annotations

import contextlib
import json
import socket
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.conftest import TINY
from training.config import load_config
from training.errors import Diverged, exit_code, EXIT_CODES

# Reading a tensor's value on the host: what makes the CPU wait for the GPU.
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__}


class DeviceValueReads(TorchFunctionMode):
    """Host reads of values derived from the model (its parameters, their gradients, what was computed from them),
    by the step the trainer is in. Host-side tensors (token counts, the stop flags reduced over gloo) are not
    derived: on a GPU they never leave the CPU."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.derived = trainer, {}  # id -> weak reference (tensors compare elementwise)
        self.by_step: dict[int, int] = {}

    def _from_model(self, t) -> bool:
        if isinstance(t, (list, tuple)):  # the foreach ops over the gradients (clipping, the optimizer)
            grads = {id(p.grad) for p in self.trainer.model.parameters()}
            return any(id(x) in grads or self._from_model(x) for x in t)
        if not isinstance(t, torch.Tensor):
            return False
        ref = self.derived.get(id(t))
        return t.requires_grad or (ref is not None and ref() is t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from_model = any(self._from_model(a) for a in (*args, *kwargs.values()))
        if func in READS and from_model:
            step = self.trainer.tracker.at[0]
            self.by_step[step] = self.by_step.get(step, 0) + 1
        out = func(*args, **kwargs)
        if from_model:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.derived[id(t)] = weakref.ref(t)
        return out


def trainer(tmp_path, monkeypatch, *extra: str):
    from training.job.trainer import Trainer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for k, v in {**env, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    argv = [*TINY, "--model.dropout", "0", "--job.out_dir", str(tmp_path), "--parallel.wedge_floor_s", "0"]
    return Trainer(load_config([*argv, *extra]))


def records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def run(tmp_path, monkeypatch, *extra: str, count: bool = False) -> tuple[int, dict[int, int], "object"]:
    t = trainer(tmp_path, monkeypatch, *extra)
    try:
        with DeviceValueReads(t) if count else contextlib.nullcontext() as reads:
            code = t.train()
        return code, reads.by_step if count else {}, t
    finally:
        t.close()


def test_figures_are_read_only_at_read_points_and_the_run_is_bitwise_the_read_every_step_one(tmp_path, monkeypatch):
    steps = ["--train.steps", "6", "--checkpoint.interval", "5"]
    code, reads, deferred = run(tmp_path / "a", monkeypatch, *steps, "--metrics.log_every", "4", count=True)
    assert code == 0
    # steps 1-3 read nothing; the log line at 4 reads once; the save at 5 and the last step 6 read once and
    # check the weights before saving (their own reads). Before: one read in every step.
    assert sorted(reads) == [4, 5, 6] and reads[4] == 1
    code, _, each = run(tmp_path / "b", monkeypatch, *steps, "--metrics.log_every", "1")  # reads every step
    assert code == 0
    for p, q in zip(deferred.model.parameters(), each.model.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor())
    a, b = (
        [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(tmp_path / d) if r["event"] == "step"]
        for d in "ab"
    )
    assert a == b and [s for s, *_ in a] == list(range(1, 7))


def test_a_non_finite_step_between_read_points_stops_the_run_before_the_next_checkpoint(tmp_path, monkeypatch):
    args = ["--train.steps", "8", "--checkpoint.interval", "4", "--metrics.log_every", "4", "--fault.nan_at_step", "6"]
    t = trainer(tmp_path, monkeypatch, *args)
    try:
        with pytest.raises(Diverged) as e:
            t.train()
    finally:
        t.close()
    assert exit_code(e.value, EXIT_CODES) == 5
    assert str(e.value).startswith("non-finite loss nan / gradient norm nan at step 6 (1 bad step(s) in a row")
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_00000004"]
    assert [r["step"] for r in records(tmp_path) if r["event"] == "step"] == [1, 2, 3, 4, 5]
    assert t.recorded_step == 5  # the `end` record's step, as when the guard read every step

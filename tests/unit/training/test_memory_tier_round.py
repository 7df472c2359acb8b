"""In-memory snapshots carry their worker group's rendezvous round, and the commit fence's restore rule applies to
them: a snapshot a replaced round wrote after a later round restored from an older step is never offered (one
process, a gloo world of one)."""

from __future__ import annotations

import logging

import pytest
import torch

from training.checkpoint.memory import _Generations
from training.checkpoint.stale_rule import stale_checkpoints

from tests.unit.training.test_memory_tier import Plain, tier

pytestmark = pytest.mark.usefixtures("world_of_one")


def snapshot_of_round(root, round_: int, steps: int = 3) -> Plain:
    src = Plain(0)
    for _ in range(steps):
        src.train_step()
    t = tier(root)
    t.round = round_
    t.snapshot(steps, {"train": src})
    t.wait()
    return src


def test_a_snapshot_records_its_round(tmp_path):
    snapshot_of_round(tmp_path, 4)
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir() and d.name != "ckpt"]
    ((step, meta, _),) = _Generations(run_dir, "own-r0-w1").complete()
    assert (step, meta["round"]) == (3, 4)


def test_a_snapshot_of_a_replaced_round_newer_than_a_later_restore_is_not_offered(tmp_path, caplog):
    snapshot_of_round(tmp_path, 0)  # round 0 snapshotted step 3 after round 1 had restored from step 2
    t = tier(tmp_path)
    t.round = 2
    t.stale = lambda rnd, step: stale_checkpoints({step: rnd}, {1: 2}).get(step)
    with caplog.at_level(logging.WARNING, logger="training"):
        assert t.restore({"train": Plain(1)}, storage_step=0) is None  # storage, not the stale snapshot
    assert "memory snapshot own-r0-w1 of step 3 not used: written by round 0 after round 1 had replaced it" in (
        caplog.text
    )


def test_a_snapshot_no_later_round_replaced_is_restored(tmp_path):
    src = snapshot_of_round(tmp_path, 0)
    t = tier(tmp_path)
    t.round = 1
    t.stale = lambda rnd, step: stale_checkpoints({step: rnd}, {1: 3}).get(step)  # round 1 restored step 3 itself
    dst = Plain(1)
    got = t.restore({"train": dst}, storage_step=0)
    assert got is not None and got.step == 3
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict()["net"].values(), dst.state_dict()["net"].values()))

"""memory_interval=auto on the real tier (a gloo world of 1): the first snapshots every step, then the interval its
own measured cost and step time give; a restore still brings back exactly the newest snapshotted step; a fixed
interval keeps its steps and is reported once when over budget. The figures come from real copies: the states
and steps are sized so the outcome does not hang on this machine's speed (a 32 MB copy against a ~1 ms step is
far over any budget; a tiny state against 0.25 s steps is far under 80%). Two ranks agreeing: the _e2e file."""

from __future__ import annotations

import time

import pytest
import torch

from training.checkpoint.memory import MemoryTier
from training.config import load_config


class Blob:
    """A Stateful holding one tensor that each 'step' changes (every value says which step it is)."""

    def __init__(self, numel: int):
        self.w = torch.zeros(numel)

    def state_dict(self):
        return {"w": self.w}

    def load_state_dict(self, sd):
        self.w.copy_(sd["w"])


# the tier's collectives on a gloo world of one process (file rendezvous: no socket connects)
pytestmark = pytest.mark.usefixtures("world_of_one")


def tier(root, interval: str, budget: float = 0.02, storage_interval: int = 5) -> MemoryTier:
    cfg = load_config(
        [
            "--checkpoint.memory_interval",
            interval,
            "--checkpoint.memory_budget",
            str(budget),
            "--checkpoint.interval",
            str(storage_interval),
            "--checkpoint.memory_dir",
            str(root),
        ]
    ).checkpoint
    return MemoryTier.build(
        cfg,
        rank=0,
        world=1,
        local_world=1,
        checkpoint_dir=str(root / "ckpt"),
        identity={"model": "blob"},
        device=torch.device("cpu"),
    )


def train(t: MemoryTier, blob: Blob, steps: int, step_s: float = 0.0) -> list[int]:
    """The trainer's order: wait for the copy before the state changes, step, snapshot if due. The steps taken."""
    taken = []
    for step in range(1, steps + 1):
        t.wait()
        blob.w.fill_(step)
        time.sleep(step_s)
        if t.due(step):
            t.snapshot(step, {"blob": blob})
            taken.append(step)
            assert t.due(step) or not t.enabled  # still a snapshot step after it (the straggler watch asks then)
    t.wait()
    return taken


def test_auto_measures_every_step_then_snapshots_as_often_as_the_budget_allows(tmp_path):
    t = tier(tmp_path, "auto")
    taken = train(t, Blob(8 << 20), 20)  # 32 MB copied and checksummed per snapshot; steps of ~a millisecond
    # steps 1-3 measure (the first two pay one-time costs); at step 4 the cost is known: over budget at every
    # interval, so the cap: the storage checkpoint's interval (5)
    assert taken == [1, 2, 3, 4, 9, 14, 19]
    [chosen] = t.news
    assert chosen.auto and chosen.interval == 5 and chosen.share > 0.02
    assert chosen.line().startswith("[checkpoint] in-memory snapshot every 5 steps (each blocks ")
    assert "over the budget 2%: at most checkpoint.interval=5" in chosen.line()
    assert chosen.line().endswith("a failure costs at most 5 steps")
    back = Blob(8 << 20)
    got = tier(tmp_path, "auto").restore({"blob": back}, storage_step=0)
    assert got is not None and got.step == 19 and torch.equal(back.w, torch.full((8 << 20,), 19.0))


def test_auto_stays_at_every_step_when_a_snapshot_is_cheap(tmp_path):
    # a 64-byte snapshot against 0.25 s steps: under the 80% budget even when a loaded host takes 0.2 s to copy it
    # (0.1 s steps and 50% failed at load 8-15, both on main and in a helper's branch)
    t = tier(tmp_path, "auto", budget=0.8)
    taken = train(t, Blob(16), 8, step_s=0.25)
    assert taken == list(range(1, 9)) and t.interval == 1
    assert [c.interval for c in t.news] == [1]
    assert t.news[0].line().startswith("[checkpoint] in-memory snapshot every step (")
    assert t.news[0].line().endswith("budget 80%): a failure costs at most 1 step")


def test_a_fixed_interval_keeps_its_steps_and_is_reported_once_when_over_budget(tmp_path):
    t = tier(tmp_path, "1")
    assert train(t, Blob(8 << 20), 12) == list(range(1, 13))  # every step, as set: no measurement moves it
    [over] = t.news
    assert not over.auto and over.interval == 1 and t.interval == 1
    assert over.line().startswith("[checkpoint] memory_interval=1 costs ")
    assert over.line().endswith("above checkpoint.memory_budget 2%: `auto` would take every 5 steps")
    t2 = tier(tmp_path, "2")
    assert train(t2, Blob(16), 8) == [2, 4, 6, 8] and t2.news == []  # judged after 6 snapshots: not yet


def test_off_stays_off(tmp_path):
    t = tier(tmp_path, "0")
    assert not t.enabled and train(t, Blob(16), 3) == [] and t.news == []

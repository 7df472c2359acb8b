"""The in-memory snapshot tier in one process (a gloo world of 1): a snapshot restores the exact state, a
copy cut short is never offered, another run's or another model's snapshot is never loaded, a finished run
leaves nothing behind. The multi-process paths (peer replica, kills) are in test_memory_tier_e2e.py."""

from __future__ import annotations

import os
import time

import pytest
import torch

from training.config import load_config
from training.checkpoint.memory import MemoryTier, _Generations, _remove_stale, run_key
from training.checkpoint.state import Progress


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4, dtype=torch.bfloat16)


class Plain:
    """A Stateful over a module + AdamW + progress, like TrainState without FSDP."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.net = Net()
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3)
        self.progress = Progress()

    def train_step(self):
        x = torch.randn(4, 8)
        self.net.b(self.net.a(x).to(torch.bfloat16)).float().sum().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.progress.step += 1
        self.progress.data_offset += 4

    def state_dict(self):
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "progress": self.progress.state_dict()}

    def load_state_dict(self, sd):
        self.net.load_state_dict(sd["net"])
        self.opt.load_state_dict(sd["opt"])
        self.progress.load_state_dict(sd["progress"])


# the tier's collectives on a gloo world of one process (file rendezvous: no socket connects)
pytestmark = pytest.mark.usefixtures("world_of_one")


def tier(root, identity=None, interval=1) -> MemoryTier:
    cfg = load_config(["--checkpoint.memory_interval", str(interval), "--checkpoint.memory_dir", str(root)]).checkpoint
    return MemoryTier.build(
        cfg,
        rank=0,
        world=1,
        local_world=1,
        checkpoint_dir=str(root / "ckpt"),
        identity=identity or {"model": "net"},
        device=torch.device("cpu"),
    )


def test_a_snapshot_restores_the_exact_state(tmp_path):
    src = Plain(0)
    for _ in range(3):
        src.train_step()
    t = tier(tmp_path)
    t.snapshot(3, {"train": src})
    t.wait()
    dst = Plain(1)  # other weights, no optimizer state yet
    dst.train_step()
    got = tier(tmp_path).restore({"train": dst}, storage_step=0)
    assert got is not None and (got.step, got.tier) == (3, "memory")
    for (k, a), b in zip(src.state_dict()["net"].items(), dst.state_dict()["net"].values()):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    sa, sb = src.opt.state_dict()["state"], dst.opt.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert dst.progress == src.progress
    # not newer than the storage checkpoint: storage is used (None)
    assert tier(tmp_path).restore({"train": Plain(2)}, storage_step=3) is None


def test_a_copy_cut_short_is_never_offered(tmp_path):
    src = Plain(0)
    t = tier(tmp_path)
    for step in (1, 2):
        src.train_step()
        t.snapshot(step, {"train": src})
        t.wait()
    gens = t.own
    slot, _ = gens.begin(16)  # the next copy starts (step 3) and is killed before its metadata is written
    assert sorted(g[0] for g in gens.complete()) == [2] and gens.read(slot) is None
    assert tier(tmp_path).restore({"train": Plain(1)}, storage_step=0).step == 2


def test_another_model_or_run_never_gets_the_snapshot(tmp_path):
    src = Plain(0)
    src.train_step()
    t = tier(tmp_path)
    t.snapshot(1, {"train": src})
    t.wait()
    assert tier(tmp_path, identity={"model": "other"}).restore({"train": Plain(1)}, storage_step=0) is None
    assert run_key(str(tmp_path / "a")) != run_key(str(tmp_path / "b"))  # one directory per checkpoint.dir
    off = tier(tmp_path, interval=0)
    assert not off.enabled and off.snapshot(1, {"train": src}) == 0.0 and off.restore({}, storage_step=0) is None


def test_a_finished_run_removes_its_snapshots_and_stale_runs_are_swept(tmp_path):
    src = Plain(0)
    src.train_step()
    t = tier(tmp_path)
    t.snapshot(1, {"train": src})
    t.close(discard=True)
    assert not t.root.exists()
    old = tmp_path / "0123456789abcdef"
    old.mkdir()
    (old / "own-r0-w1.0.data").write_bytes(b"x")
    (old / ".t5-failover-snapshots").write_text("{}")  # made by the tier (its marker)
    past = time.time() - 2 * 24 * 3600
    for p in (old / "own-r0-w1.0.data", old / ".t5-failover-snapshots", old):
        os.utime(p, (past, past))
    fresh = tmp_path / "fedcba9876543210"
    fresh.mkdir()
    _remove_stale(tmp_path, keep="none")
    assert not old.exists() and fresh.exists()


def test_generations_alternate_slots(tmp_path):
    g = _Generations(tmp_path, "own-r0-w1")
    s0, _ = g.begin(8)
    g.publish(s0, 1, torch.save({"step": 1, "nbytes": 8}, tmp_path / "m") or (tmp_path / "m").read_bytes())
    s1, _ = g.begin(8)
    assert s1 != s0 and g.current() == {"slot": s0, "step": 1}


def test_a_slot_published_again_is_read_anew_not_from_the_parsed_meta_cache(tmp_path):
    # A restore reads each meta several times and parses it once (training.checkpoint.memory._read_meta); a slot
    # written again (same size, same slot, next-but-one step) must read as the new step, never the cached one.
    from training.checkpoint.memory import _to_bytes

    g = _Generations(tmp_path, "own-r0-w1")
    for step in (1, 2, 3, 4, 5):
        slot, buf = g.begin(8)
        buf[:8] = step
        g.publish(slot, step, _to_bytes({"step": step, "nbytes": 8}))
        assert g.find(step) is not None and g.find(step)[1]["step"] == step
        assert sorted(got[0] for got in g.complete()) == ([step - 1, step] if step > 1 else [1])
        assert g.find(step - 2) is None  # overwritten: gone, not served from the cache


def _row_set(n: int, world: int, rank: int) -> set[int]:
    from training.checkpoint.memory import _rows

    first, count = _rows(n, world, rank)
    return set(range(first, first + count))


@pytest.mark.parametrize("rows, old_world, world", [(10, 4, 2), (10, 2, 4), (3, 4, 3), (64, 4, 3), (1, 2, 3)])
def test_each_new_shard_gets_exactly_the_old_shards_that_hold_its_rows(rows, old_world, world):
    from training.checkpoint.memory import _old_shards_needed

    covered: list[int] = []
    for r in range(world):
        mine = _row_set(rows, world, r)
        need = _old_shards_needed(r, world, old_world, [rows])
        assert mine <= set().union(*(_row_set(rows, old_world, s) for s in need))  # every row is in a shard it gets
        for s in need - {r}:  # its own old rank comes for its RNG; any other only for rows it holds
            assert not mine or mine & _row_set(rows, old_world, s)
        covered += sorted(mine)
    assert sorted(covered) == list(range(rows))  # the new shards partition the rows


# ----------------------------------------------------------------------------- checked generations
def flip(path, offset: int, n: int = 64) -> None:
    """Damage `n` bytes of a file in place (each byte inverted), as failing memory would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        good = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in good))


def snapshots(t: MemoryTier, src: Plain, steps) -> dict[int, dict]:
    """Snapshot `src` after each of `steps` training steps; returns each step's state (deep copies)."""
    import copy

    states = {}
    for step in steps:
        src.train_step()
        t.snapshot(step, {"train": src})
        t.wait()
        states[step] = copy.deepcopy(src.state_dict())
    return states


def generation(t: MemoryTier, step: int) -> tuple[int, dict]:
    slot = next(s for s in (0, 1) if (g := t.own.read(s)) is not None and g[0] == step)
    return slot, t.own.read(slot)[1]


def test_every_generation_carries_the_storage_tiers_crc32c_of_its_bytes(tmp_path):
    from training.checkpoint.integrity import crc32c_file

    t = tier(tmp_path)
    snapshots(t, Plain(0), [1, 2])
    for step in (1, 2):
        slot, meta = generation(t, step)
        assert meta["crc32c"] == crc32c_file(t.own.path(f"{slot}.data"))  # the file is exactly the snapshot's bytes


def test_copy_checked_copies_any_layout_and_checksums_what_it_wrote():
    from training.checkpoint.integrity import crc32c_bytes
    from training.checkpoint.memory import COPY_CHUNK, _copy_checked, _layout, _views

    tensors = [
        torch.arange(12.0).view(3, 4).t(),  # strided
        torch.tensor(7, dtype=torch.int64),  # 0-dim
        torch.randn(COPY_CHUNK // 4 + 3),  # more than one piece
        torch.ones(5, dtype=torch.bfloat16),
    ]
    layout, nbytes = _layout(tensors)
    buf = torch.full((nbytes,), 0xAB, dtype=torch.uint8)  # padding holds whatever was there: still covered
    crc = _copy_checked(buf, layout, nbytes, tensors)
    assert crc == crc32c_bytes(buf[:nbytes])
    assert all(torch.equal(v, t) for v, t in zip(_views(buf, layout), tensors))


def test_a_damaged_newest_snapshot_is_named_moved_aside_and_the_previous_step_restored(tmp_path, caplog):
    t = tier(tmp_path)
    states = snapshots(t, Plain(0), [1, 2])
    slot, meta = generation(t, 2)
    flip(t.own.path(f"{slot}.data"), meta["nbytes"] // 2)
    dst = Plain(1)
    with caplog.at_level("WARNING", logger="training"):
        got = tier(tmp_path).restore({"train": dst}, storage_step=0)
    assert got is not None and (got.step, got.tier) == (1, "memory")
    (skipped,) = got.skipped
    assert skipped["copy"] == "own" and (skipped["rank"], skipped["step"]) == (0, 2)
    assert skipped["expected"] == meta["crc32c"] and skipped["found"] != meta["crc32c"]
    (line,) = [r.getMessage() for r in caplog.records if "damaged memory snapshot" in r.getMessage()]
    assert "own-node copy of rank 0's shard of step 2" in line and f"expected {meta['crc32c']}" in line
    (moved,) = (t.root / "quarantine").iterdir()  # kept for inspection, not deleted
    names = sorted(p.name for p in moved.iterdir())
    assert names == ["DAMAGED.txt", f"own-r0-w1.{slot}.data", f"own-r0-w1.{slot}.meta"]
    assert str(moved) in line
    assert all(torch.equal(a, b) for a, b in zip(states[1]["net"].values(), dst.state_dict()["net"].values()))
    assert dst.progress.step == 1


def test_with_every_generation_damaged_the_restore_goes_to_storage_and_says_why(tmp_path):
    t = tier(tmp_path)
    snapshots(t, Plain(0), [1, 2])
    for step in (1, 2):
        slot, meta = generation(t, step)
        flip(t.own.path(f"{slot}.data"), 0)
    again = tier(tmp_path)
    assert again.restore({"train": Plain(1)}, storage_step=0) is None
    assert sorted(d["step"] for d in again.skipped) == [1, 2]


def test_a_generation_no_newer_than_storage_is_not_even_read(tmp_path):
    t = tier(tmp_path)
    snapshots(t, Plain(0), [1, 2])
    slot, meta = generation(t, 1)
    flip(t.own.path(f"{slot}.data"), 0)
    again = tier(tmp_path)
    assert again.restore({"train": Plain(1)}, storage_step=1).step == 2 and again.skipped == []


def test_the_quarantine_keeps_the_newest_damaged_generations_only(tmp_path):
    """Damaged generations live in the node's memory: a copy damaged at every step must not fill it."""
    from training.checkpoint.memory import QUARANTINE_KEEP

    g = _Generations(tmp_path, "peer-r1-w2")
    for step in range(1, QUARANTINE_KEEP + 3):
        slot, buf = g.begin(8)
        g.path(f"{slot}.meta").write_bytes(b"m")
        assert g.quarantine(slot, step, "damaged") is not None
    kept = sorted(p.name.split(".")[1] for p in (tmp_path / "quarantine").iterdir())
    assert kept == [f"step{s:08d}" for s in range(3, QUARANTINE_KEEP + 3)]

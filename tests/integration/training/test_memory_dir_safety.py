"""The in-memory tier never deletes what it did not create, and a memory directory that fills up or cannot be
used turns the tier off with a warning instead of killing the job (issue 29, items 1, 3 and 4).

Each data-loss case checksums the user's files before and after. The full-tmpfs case runs on a real 1 MiB tmpfs
(mounting one needs root: the test skips elsewhere, saying so) in a child process, since the failure it guards
against is a SIGBUS that would take the test runner down with it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import ROOT
from training.config import load_config
from training.checkpoint.memory import MemoryTier, is_run_dir

DAY = 24 * 3600


def tree_digest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under root (the user's data, before and after)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def age(path: Path, seconds: float) -> None:
    """Make everything under `path` look untouched for `seconds`."""
    past = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (past, past), follow_symlinks=False)


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def build(memory_dir: Path, checkpoint_dir: Path) -> MemoryTier:
    cfg = load_config(["--checkpoint.memory_dir", str(memory_dir)]).checkpoint
    return MemoryTier.build(
        cfg,
        rank=0,
        world=1,
        local_world=1,
        checkpoint_dir=str(checkpoint_dir),
        identity={"model": "net"},
        device=torch.device("cpu"),
    )


class Tiny:
    def __init__(self):
        self.w = torch.nn.Linear(4, 4)

    def state_dict(self):
        return self.w.state_dict()

    def load_state_dict(self, sd):
        self.w.load_state_dict(sd)


def test_a_users_old_folders_in_memory_dir_survive_the_start(tmp_path, world_of_one):
    """--checkpoint.memory_dir pointed at a directory with a user's old folders (and another run's checkpoints,
    and a folder named like a run key that the tier did not make): none of it is removed, however old."""
    home = tmp_path / "home"
    (home / "old_project").mkdir(parents=True)
    (home / "old_project" / "notes.txt").write_text("three years of notes")
    (home / "checkpoints" / "step_00000004").mkdir(parents=True)
    (home / "checkpoints" / "step_00000004" / "__0_0.distcp").write_bytes(os.urandom(4096))
    (home / "0123456789abcdef").mkdir()  # hex name, but no marker: not the tier's
    (home / "0123456789abcdef" / "data.bin").write_bytes(os.urandom(512))
    age(home, 30 * DAY)
    before = tree_digest(home)
    tier = build(home, tmp_path / "ckpt")
    assert tier.root.parent == home and is_run_dir(tier.root)  # its own directory is marked
    after = {k: v for k, v in tree_digest(home).items() if not k.startswith(tier.root.name + "/")}
    assert after == before


def test_only_the_tiers_own_stale_directories_are_swept(tmp_path, world_of_one):
    shm = tmp_path / "shm"
    abandoned = build(shm, tmp_path / "abandoned-ckpt")
    abandoned.snapshot(1, {"t": Tiny()})
    abandoned.wait()
    age(abandoned.root, 2 * DAY)
    recent = build(shm, tmp_path / "recent-ckpt")
    recent.snapshot(1, {"t": Tiny()})
    recent.wait()
    build(shm, tmp_path / "ckpt")  # a start sweeps the stale one only
    assert not abandoned.root.exists() and recent.root.exists()


def test_a_finished_run_removes_its_directory_marker_and_all(tmp_path, world_of_one):
    tier = build(tmp_path / "shm", tmp_path / "ckpt")
    tier.snapshot(1, {"t": Tiny()})
    tier.close(discard=True)
    assert not tier.root.exists() and (tmp_path / "shm").exists()


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_an_unusable_memory_dir_turns_the_tier_off_with_a_warning(tmp_path, world_of_one, caplog, tmpfs, kind):
    """Mid-run (after the start checks) the memory directory is a file or on a read-only file system: a
    warning, no crash; the job trains on with storage checkpoints."""
    if kind == "file":
        where = tmp_path / "shm"
        where.write_text("not a directory")
    else:
        where = tmpfs("ro", "size=1m,ro")
    tier = build(where, tmp_path / "ckpt")
    assert tier.snapshot(1, {"t": Tiny()}) >= 0 and not tier.enabled
    assert "in-memory snapshots are off" in caplog.text and str(where) in caplog.text


FILL_AND_SNAPSHOT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from training.config import load_config
    from training.checkpoint.memory import MemoryTier
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    cfg = load_config(["--checkpoint.memory_dir", sys.argv[1], "--checkpoint.memory_replica", "false"]).checkpoint
    tier = MemoryTier.build(cfg, rank=0, world=1, local_world=1, checkpoint_dir=sys.argv[3],
                            identity={"m": 1}, device=torch.device("cpu"))
    net = torch.nn.Linear(64, 256)  # 65 kB of weights: two generations fit the 1 MiB tmpfs easily
    state = {"net": net}
    tier.snapshot(1, state); tier.wait()
    print("first snapshot ok, failed =", tier.failed, flush=True)
    # another process fills the file system (here: this one, with a plain file)
    with open(os.path.join(sys.argv[1], "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as e:
            print("filled:", e.strerror, flush=True)
    tier.snapshot(2, state); tier.wait()
    print("second snapshot done, failed =", tier.failed, flush=True)
""")


def test_a_full_tmpfs_is_a_warning_not_a_sigbus(tmp_path, tmpfs):
    mnt = tmpfs("full", "size=1m")
    r = subprocess.run(
        [sys.executable, "-c", FILL_AND_SNAPSHOT, str(mnt), str(tmp_path / "store"), str(tmp_path / "ckpt")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert "first snapshot ok, failed = False" in out and "filled: No space left on device" in out, out
    assert r.returncode == 0, f"the snapshot killed the process (rc {r.returncode}; -7 is SIGBUS):\n{out}"
    assert "second snapshot done, failed = True" in out and "in-memory snapshot failed" in out, out
    assert "No space left on device" in out.split("filled:")[1]


@pytest.mark.parametrize("relative", ["snaps", "./shm/t5"])
def test_a_relative_memory_dir_is_refused_and_nothing_is_made(tmp_path, relative):
    """Round 4, case 2: a relative memory_dir resolved against the checkout: the snapshots went to disk under the
    project folder, without a word, and an empty directory stayed there. Run from a scratch directory (where such
    a path would land) through the real entry point."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "--checkpoint.memory_dir",
            relative,
            "--train.steps",
            "1",
            "--job.out_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert (r.returncode, r.stdout) == (2, ""), r.stdout + r.stderr
    assert r.stderr == (
        f"error: checkpoint.memory_dir={relative!r} is a relative path: the snapshots must be on "
        "node-local shared memory; pass an absolute tmpfs path (e.g. --checkpoint.memory_dir "
        "/dev/shm/t5-failover) or leave it empty\n"
    )
    assert list(tmp_path.iterdir()) == []  # neither the snapshot directory nor the run's

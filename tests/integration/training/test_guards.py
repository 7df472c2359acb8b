"""Unit tests of the pieces that keep checkpoints honest: the non-finite guard, checksums and their split over
ranks, storage error reasons, the run fingerprint and its diff."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from training.errors import Diverged
from training.job.guard import NonFiniteGuard
from training.checkpoint.integrity import storage_reason


@pytest.fixture(scope="module")
def world1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_check_weights_refuses_non_finite_weights(world1):
    model = torch.nn.Linear(4, 4)
    NonFiniteGuard.check_weights(model, 3)
    with torch.no_grad():
        model.weight[1, 2] = float("inf")
    with pytest.raises(Diverged, match="after step 3 are not finite"):
        NonFiniteGuard.check_weights(model, 3)


def test_a_write_failure_without_errno_on_a_full_device_is_named_as_a_full_device(tmp_path):
    # PyTorch's stream writer reports ENOSPC as "unexpected pos N vs M" (no errno); the reason must still
    # say the device is full. A real full tmpfs, in a private mount namespace.
    probe = (
        "import sys; from training.checkpoint.integrity import storage_reason; d = sys.argv[1]\n"
        "try:\n    open(d + '/fill', 'wb').write(b'x' * (1 << 20))\nexcept OSError: pass\n"
        "print(storage_reason(RuntimeError('[enforce fail at inline_container.cc:672] . "
        "unexpected pos 704 vs 598'), d))"
    )
    full = tmp_path / "full"
    full.mkdir()
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"',
            str(full),
            sys.executable,
            "-c",
            probe,
            str(full),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"no space left on the device (0 bytes free on {full})"
    # with room to spare, the library's own words are kept
    assert "unexpected pos" in storage_reason(RuntimeError("unexpected pos 704 vs 598"), tmp_path)


def test_a_step_directory_appears_with_its_ownership_file_and_scratch_left_by_a_kill_is_ours(world1, tmp_path):
    """A rank killed between creating a step directory and writing its ownership file used to leave a step
    directory the next start took for a stranger's (and refused to overwrite). Now the directory is made under a
    scratch name and renamed into place; a scratch left by a kill is ours: not reported, removed by the next save."""
    from training.checkpoint.storage import OWNED, StorageTier, foreign_entries, is_ours, step_dir
    from training.config import CheckpointConfig

    root = tmp_path / "ckpt"
    root.mkdir()
    left = root / ".step_00000002.new-4242"  # what a kill between mkdir and rename leaves
    left.mkdir()
    assert foreign_entries(root) == []
    (root / "step_00000009").mkdir()  # a stranger's directory is still reported
    assert foreign_entries(root) == ["step_00000009"]
    mgr = StorageTier(CheckpointConfig(dir=str(root), async_save=False), rank=0, world_size=1, signature={})
    mgr.save(2, {"w": torch.arange(4.0)}, force=True)
    mgr.close()
    made = step_dir(root, 2)
    assert is_ours(made) and (made / OWNED).is_file() and (made / "COMMITTED.json").is_file()
    assert not left.exists() and sorted(p.name for p in root.iterdir() if p.name.startswith(".step")) == []


def test_a_removal_of_ours_killed_midway_leaves_no_step_directory_a_resume_would_refuse(world1, tmp_path, monkeypatch):
    """CI once saw a resume refused (exit 2, "holds step_00000006, which this job did not write"): rank 0 had been
    killed while deleting its failed save of step 6, and rmtree had removed the ownership file first. A step
    directory of ours is now renamed to a scratch name before it is deleted: a kill midway (here: the deletion
    raises after removing the ownership file) leaves only scratch, which is ours and swept by the next save."""
    import shutil

    from training.checkpoint import layout
    from training.checkpoint.storage import OWNED, StorageTier, foreign_entries, is_ours, step_dir
    from training.config import CheckpointConfig

    root = tmp_path / "ckpt"
    root.mkdir()
    mgr = StorageTier(CheckpointConfig(dir=str(root), async_save=False), rank=0, world_size=1, signature={})
    mgr.save(6, {"w": torch.arange(4.0)}, force=True)
    assert is_ours(step_dir(root, 6))

    def killed_midway(path, ignore_errors=False):
        (Path(path) / OWNED).unlink()  # rmtree's first victim, then the process dies
        raise SystemExit("killed")

    rmtree = shutil.rmtree
    monkeypatch.setattr(layout.shutil, "rmtree", killed_midway)
    with pytest.raises(SystemExit):
        mgr._discard(6)  # what a failed async save does; the same helper serves the leftover and _prune paths
    monkeypatch.setattr(layout.shutil, "rmtree", rmtree)
    assert not step_dir(root, 6).exists() and foreign_entries(root) == []  # nothing a resume would refuse
    mgr.check_no_clash(1, 10)  # the start check that refused in CI: passes
    mgr.save(6, {"w": torch.arange(4.0)}, force=True)  # the step is saved again; the scratch is swept
    mgr.close()
    assert is_ours(step_dir(root, 6)) and [p.name for p in root.iterdir() if p.name.startswith(".step")] == []


def test_checkpoint_collectives_wait_a_bound_from_the_timed_saves_not_the_hour(world1, tmp_path):
    """The load and the first save wait checkpoint.timeout_s; from the next save on, the group's real timeout
    is max(min_timeout_s, 4 x the slowest save), so a peer silent mid-save costs seconds, not an hour."""
    from datetime import timedelta
    from training.checkpoint.storage import StorageTier
    from training.config import CheckpointConfig

    mgr = StorageTier(
        CheckpointConfig(dir=str(tmp_path), async_save=False, timeout_s=3600, min_timeout_s=7),
        rank=0,
        world_size=1,
        signature={},
    )
    timeout = lambda: mgr.group._get_backend(torch.device("cpu")).options._timeout  # noqa: E731
    assert timeout() == timedelta(seconds=3600)
    mgr.save(1, {"w": torch.arange(4.0)}, force=True)
    assert timeout() == timedelta(seconds=3600) and 0 < mgr._slowest_save_s < 7 / 4
    mgr.save(2, {"w": torch.arange(4.0)}, force=True)
    assert timeout() == timedelta(seconds=7) and mgr.collective_timeout_s == 7
    mgr._slowest_save_s = 100.0  # a slow file system: the bound follows it, capped by timeout_s
    mgr.save(3, {"w": torch.arange(4.0)}, force=True)
    assert timeout() == timedelta(seconds=400)
    mgr._slowest_save_s = 5000.0
    mgr.save(4, {"w": torch.arange(4.0)}, force=True)
    assert timeout() == timedelta(seconds=3600)
    mgr.close()

"""checkpoint.writer=process: the rank's writer process writes async saves that load bitwise, is started once with
the tier and ends with it (asked at close; on its own when its trainer is SIGKILLed, mid-write too), never
receives the job's signals, and a save it does not finish is never taken as complete."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import ROOT
from training.checkpoint.layout import MARKER, latest_complete, step_dir
from training.checkpoint.storage import StorageTier
from training.config import CheckpointConfig
from training.errors import CheckpointStorageError


class SlowToWrite:
    """A state entry the writer process takes `seconds` to serialize (DCP pickles non-tensor values when it writes
    them): a write that is still in flight when the test acts. Pickled at once in the training process."""

    def __init__(self, seconds: float):
        self.seconds, self.trainer = seconds, os.getpid()

    def __getstate__(self):
        if os.getpid() != self.trainer:
            time.sleep(self.seconds)
        return self.__dict__


@pytest.fixture
def world1():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: bound at once, no free port to race for
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tier(root: Path) -> StorageTier:
    return StorageTier(CheckpointConfig(dir=str(root), writer="process"), rank=0, world_size=1, signature={})


def _gone(pid: int, within_s: float) -> bool:
    """`pid` no longer runs (ended, or a zombie nobody reaped yet) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_the_writer_process_writes_checkpoints_that_load_bitwise_and_ends_at_close(world1, tmp_path):
    torch.manual_seed(0)
    state = {"train": {"w": torch.randn(300, 70), "b": torch.randn(70).double(), "step": 7}, "rng_0": torch.randn(5)}
    tier = _tier(tmp_path)
    writer = tier.writer._writes.process
    assert writer.is_alive() and writer.pid != os.getpid()  # started with the tier, before any save
    for step in (1, 2):
        state["train"]["w"].add_(1.0)  # each save holds the state at its call
        blocked = tier.save(step, state, force=True)
        assert blocked >= 0
        tier.wait()
        assert tier.failure is None
    assert (step_dir(tmp_path, 2) / MARKER).is_file() and latest_complete(tmp_path) == step_dir(tmp_path, 2)
    loaded = {"train": {"w": torch.zeros(300, 70), "b": torch.zeros(70).double(), "step": 0}, "rng_0": torch.zeros(5)}
    info = tier.load(loaded)
    assert info["step"] == 2 and loaded["train"]["step"] == 7
    for got, want in ((loaded["train"]["w"], state["train"]["w"]), (loaded["train"]["b"], state["train"]["b"])):
        assert torch.equal(got, want) and got.dtype == want.dtype
    assert torch.equal(loaded["rng_0"], state["rng_0"])
    tier.close()
    assert _gone(writer.pid, within_s=5) and multiprocessing.active_children() == []


def test_the_writers_port_is_held_from_the_agreement_until_the_writer_serves_it(world1, tmp_path):
    """Rank 0 picks the writers' port and its writer serves it seconds later (a spawned interpreter importing
    torch): the port must be held in between, or another process can take it (EADDRINUSE in a full run)."""
    tier = _tier(tmp_path)
    try:
        addr, port = tier.writer._writes.address
        with socket.socket() as other:  # another process's bind of that port, while the writer is still starting
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError) as taken:
                other.bind(("", port))
        assert taken.value.errno == errno.EADDRINUSE
        tier.save(1, {"w": torch.arange(4.0)}, force=True)
        tier.wait()  # and the writer serves its group on that port
        assert tier.failure is None and (step_dir(tmp_path, 1) / MARKER).is_file()
    finally:
        tier.close()


def test_the_writer_process_is_born_with_the_jobs_signals_blocked(world1, tmp_path):
    """Ctrl-C, SIGTERM and Slurm's SIGUSR1 reach every process of the job: the writer must not die of them mid-save
    (the trainer checkpoints, then ends its writer)."""
    tier = _tier(tmp_path)
    try:
        tier.save(1, {"w": torch.arange(4.0)}, force=True)
        tier.wait()  # the writer has served a save: its own set-up is done
        status = Path(f"/proc/{tier.writer._writes.process.pid}/status").read_text()

        def mask(name: str) -> int:
            return int(next(ln for ln in status.splitlines() if ln.startswith(name)).split()[1], 16)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):  # blocked or ignored: either way not its death
            assert (mask("SigBlk:") | mask("SigIgn:")) & (1 << (sig - 1)), sig.name
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}  # not the test's
    finally:
        tier.close()


def test_a_writer_killed_mid_write_fails_that_save_with_its_reason_and_the_previous_checkpoint_stays(world1, tmp_path):
    tier = _tier(tmp_path)
    try:
        tier.save(1, {"w": torch.arange(4.0)}, force=True)
        tier.wait()
        tier.save(2, {"w": torch.arange(4.0), "slow": SlowToWrite(60)}, force=True)
        time.sleep(1.0)  # the writer is serializing step 2
        writer = tier.writer._writes.process
        os.kill(writer.pid, signal.SIGKILL)
        tier.wait()
        assert tier.failure and "step 2" in tier.failure and "background writer process" in tier.failure
        assert not step_dir(tmp_path, 2).exists()  # the unfinished directory is removed
        assert latest_complete(tmp_path) == step_dir(tmp_path, 1)
        with pytest.raises(CheckpointStorageError, match="step 2"):
            tier.save(3, {"w": torch.arange(4.0)}, force=True)
    finally:
        tier.close()


def test_a_save_abandoned_by_an_in_place_recovery_ends_its_writer_at_once_and_never_commits(world1, tmp_path):
    # the recovery lets the save in flight go (close with no wait): its collectives are with the old group's
    # writers; left writing, it held the trainer's pipe thread, which a worker's exit joins, until their timeout
    tier = _tier(tmp_path)
    tier.save(1, {"w": torch.arange(4.0), "slow": SlowToWrite(120)}, force=True)
    time.sleep(1.0)  # the writer is serializing step 1
    writer, pending = tier.writer._writes.process, tier.writer._pending
    tier.close(0.0)
    assert _gone(writer.pid, within_s=10), "the abandoned save's writer process still runs"
    assert pending[2].wait(10), "the abandoned save's thread still waits for its writer"
    assert not (step_dir(tmp_path, 1) / MARKER).exists() and latest_complete(tmp_path) is None


TRAINER = textwrap.dedent(
    """
    import os, socket, sys, time
    import torch, torch.distributed as dist
    sys.path.insert(0, {root!r})
    from tests.integration.training.checkpoint.test_writer_process import SlowToWrite, _tier
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
    tier = _tier({root_dir!r})
    tier.save(1, {{"w": torch.arange(4.0)}}, force=True)
    tier.wait()
    if {mid_write}:
        tier.save(2, {{"w": torch.arange(4.0), "slow": SlowToWrite(120)}}, force=True)
    print(tier.writer._writes.process.pid, flush=True)
    time.sleep(300)
    """
)


@pytest.mark.parametrize("mid_write", [False, True], ids=["idle", "mid-write"])
def test_no_writer_process_outlives_a_sigkilled_trainer_and_its_unfinished_save_is_never_taken(tmp_path, mid_write):
    root = tmp_path / "ckpt"
    root.mkdir()  # the job makes it in its start checks
    script = TRAINER.format(root=str(ROOT), root_dir=str(root), mid_write=mid_write)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        writer_pid = int(trainer.stdout.readline())
        if mid_write:
            time.sleep(1.0)  # the writer is serializing step 2
        trainer.kill()
        trainer.wait(timeout=30)
        assert _gone(writer_pid, within_s=10), f"writer {writer_pid} outlived its trainer"
    finally:
        trainer.kill()
        trainer.stdout.close()
    assert latest_complete(root) == step_dir(root, 1)  # step 2 (cut short) is not taken as complete
    assert not (step_dir(root, 2) / MARKER).exists()

"""Fault injection is one object (training.job.faults.Faults) that does nothing unless a fault.* setting is on."""

from __future__ import annotations

import errno
import math

import pytest

from training.config import FaultConfig
from training.job.faults import Faults


def test_no_setting_no_fault_at_any_point(tmp_path):
    f = Faults(FaultConfig(), rank=0, out_dir=str(tmp_path))
    assert not f.enabled
    assert f.loss(1, 2.5) == 2.5
    for step in (0, 1, 2):
        f.mid_step(step)
        f.mid_snapshot(step)
        f.during_save(step)
        f.before_commit(step)
        f.after_step(step)
    assert list(tmp_path.iterdir()) == []  # no marker: nothing fired
    assert not Faults(FaultConfig(rank=3), rank=3, out_dir=str(tmp_path)).enabled  # a target alone is no fault


def test_faults_fire_at_their_step_and_rank_only(tmp_path):
    f0 = Faults(FaultConfig(nan_at_step=2, fail_snapshot_at_step=3, rank=1), rank=0, out_dir=str(tmp_path))
    f1 = Faults(FaultConfig(nan_at_step=2, fail_snapshot_at_step=3, rank=1), rank=1, out_dir=str(tmp_path))
    assert f0.enabled and f0.loss(1, 2.0) == 2.0 and math.isnan(f0.loss(2, 2.0))  # NaN on every rank
    f0.mid_snapshot(3)  # not fault.rank
    f1.mid_snapshot(2)  # not its step
    with pytest.raises(OSError) as e:
        f1.mid_snapshot(3)
    assert e.value.errno == errno.ENOSPC and "[fault] injected" in str(e.value)


def test_a_wedge_blocks_the_calling_thread_at_its_step_and_rank_once_per_out_dir(tmp_path):
    import threading
    import time

    Faults(FaultConfig(wedge_at_step=3, rank=1), rank=0, out_dir=str(tmp_path)).mid_step(3)  # another rank: no-op
    f = Faults(FaultConfig(wedge_at_step=3, rank=1), rank=1, out_dir=str(tmp_path))
    assert f.enabled
    f.mid_step(2)  # another step: no-op
    main = threading.Thread(target=f.mid_step, args=(3,), daemon=True)  # stands in for the trainer's main thread
    main.start()
    main.join(timeout=1.0)
    assert main.is_alive()  # blocked for good; the process (this test) runs on
    assert (tmp_path / ".fault-wedge-step3").exists()
    t0 = time.monotonic()
    f.mid_step(3)  # the restarted job: the marker says it happened, no second wedge
    assert time.monotonic() - t0 < 0.5


def test_a_hold_file_holds_every_rank_after_its_step_until_removed_or_the_rank_is_asked_to_stop(tmp_path):
    import threading

    hold = tmp_path / "hold"
    stop = threading.Event()
    f = Faults(FaultConfig(hold_file=str(hold)), rank=0, out_dir=str(tmp_path), interrupted=stop.is_set)
    assert f.enabled
    f.after_step(1)  # no file: no hold
    hold.touch()
    rank = threading.Thread(target=f.after_step, args=(2,), daemon=True)
    rank.start()
    rank.join(timeout=0.5)
    assert rank.is_alive()  # held while the file exists
    hold.unlink()
    rank.join(timeout=2.0)
    assert not rank.is_alive()  # released
    hold.touch()
    rank = threading.Thread(target=f.after_step, args=(3,), daemon=True)
    rank.start()
    rank.join(timeout=0.5)
    assert rank.is_alive()
    stop.set()  # its agent's SIGTERM: the rank goes on to its next step boundary and stops there
    rank.join(timeout=2.0)
    assert not rank.is_alive() and hold.exists()

"""The TensorBoard writer behind the metrics logger (training.job.tensorboard): rank 0 only, off with a setting,
never blocking the training thread, and a broken directory costs a warning, not the run. The event files are read
back with TensorBoard's own reader; the end-to-end run with restarts is in test_watch_e2e.py."""

from __future__ import annotations

import threading
import time

from training.config import MetricsConfig
from training.job.metrics import MetricsLogger
from training.job.tensorboard import NullLog, TensorBoardLog


def config(tmp_path, **kw) -> MetricsConfig:
    return MetricsConfig(path=str(tmp_path / "metrics.jsonl"), tensorboard_dir=str(tmp_path / "tb"), **kw)


def step(n: int) -> dict:
    return dict(
        step=n,
        loss=5.0 - n / 10,
        lr=1e-3,
        grad_norm=2.0,
        tokens_per_s=1000.0 + n,
        step_time_s=0.5,
        ckpt_block_s=0.0,
        snapshot_block_s=0.0,
        world_size=2,
        restart_count=0,
        data_offset=4 * (n - 1),
        tokens=500,
    )


def read(directory):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_rank_0_writes_what_it_logs_and_other_ranks_nothing(tmp_path):
    cfg = config(tmp_path)
    assert isinstance(MetricsLogger(cfg, rank=1, total_steps=3).board, NullLog)
    m = MetricsLogger(cfg, rank=0, total_steps=3)
    m.event("start", world_size=2, restart_count=0, resumed_from=None)
    for n in (1, 2, 3):
        m.step(**step(n))
    m.end("finished", 3)
    m.close()
    acc = read(tmp_path / "tb")
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("train/loss")] == [(1, 4.9), (2, 4.8), (3, 4.7)]
    assert [e.value for e in acc.Scalars("perf/tokens_per_s")] == [1001.0, 1002.0, 1003.0]
    assert {
        "train/lr",
        "train/grad_norm",
        "perf/step_time_s",
        "perf/ckpt_block_s",
        "perf/snapshot_block_s",
        "job/world_size",
        "job/restarts",
    } <= set(acc.Tags()["scalars"])
    assert "perf/mfu" not in acc.Tags()["scalars"]  # only where the metrics have it (GPU runs that measure it)


def test_off_with_its_setting(tmp_path):
    m = MetricsLogger(config(tmp_path, tensorboard=False), rank=0, total_steps=1)
    assert isinstance(m.board, NullLog)
    m.step(**step(1))
    m.close()
    assert (tmp_path / "metrics.jsonl").read_text().count('"event": "step"') == 1
    assert not (tmp_path / "tb").exists()


def test_a_stalled_writer_never_blocks_a_record(tmp_path):
    release = threading.Event()

    class Stalled(TensorBoardLog):  # a disk that stops answering: the writer thread hangs in its first write
        @staticmethod
        def _write(w, rec):
            release.wait(30)

    board = Stalled(str(tmp_path / "tb"))
    t0 = time.perf_counter()
    for n in range(1, 20_001):  # twice what the queue holds
        board.record({"event": "step", "time": time.time(), **step(n)})
    assert time.perf_counter() - t0 < 2.0 and board._dropped > 0
    release.set()
    board.close()


def test_an_unwritable_directory_warns_once_and_training_goes_on(tmp_path, capfd):
    (tmp_path / "tb").write_text("a file where the directory should be")
    m = MetricsLogger(config(tmp_path), rank=0, total_steps=3)
    for n in (1, 2, 3):
        m.step(**step(n))
    m.close()
    err = capfd.readouterr().err
    assert err.count("TensorBoard event files in") == 1 and "training continues" in err
    assert (tmp_path / "metrics.jsonl").read_text().count('"event": "step"') == 3

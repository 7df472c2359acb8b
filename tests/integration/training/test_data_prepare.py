"""Prepared directories (``python -m training.data prepare``): the same samples as their source, memory-mapped
shards, exact resume across shard and epoch boundaries, and clear errors for a half-written or damaged one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from training.config import DataConfig
from training.data.corpus import DataSourceError
from training.data.dataset import build_dataloader, build_dataset, prepare
from training.data.prepared import read_manifest

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_data_prepare import SHARD, batches, corpus, same, set_token


@pytest.fixture
def prepared(tmp_path) -> tuple[Path, Path]:
    src = corpus(tmp_path / "c.jsonl")
    prepare(str(src), str(tmp_path / "prepared"), shard_tokens=SHARD)
    return src, tmp_path / "prepared"


def test_loader_workers_give_the_same_batches(prepared):
    _, dst = prepared
    ds = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=0)
    cfg = DataConfig(source=str(dst), seq_len=64, num_workers=1)
    start = len(ds) - 4  # the batches cross into epoch 1
    inline = batches(
        build_dataloader(
            ds, DataConfig(source=str(dst), seq_len=64), seed=0, global_batch=4, rank=0, world=1, start_offset=start
        ),
        3,
    )
    assert same(
        batches(build_dataloader(ds, cfg, seed=0, global_batch=4, rank=0, world=1, start_offset=start), 3), inline
    )


def test_a_damaged_token_read_by_a_loader_worker_is_the_same_one_line(prepared):
    _, dst = prepared
    set_token(dst / "tokens-00000.bin", 10, -1)
    cfg = DataConfig(source=str(dst), seq_len=64, num_workers=1)
    ds = build_dataset(cfg, seed=0)
    loader = iter(build_dataloader(ds, cfg, seed=0, global_batch=len(ds), rank=0, world=1, start_offset=0))
    with pytest.raises(DataSourceError) as e:
        next(loader)  # torch re-raises a worker's error with the worker's traceback as its message
    assert str(e.value).startswith(f"shard {dst / 'tokens-00000.bin'} at token 10 (byte 20) holds token id -1, ")
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)


def test_python_dash_m_runs_the_command(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "training.data", "prepare", str(corpus(tmp_path / "c.jsonl")), str(tmp_path / "p")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        r.returncode == 0
        and r.stdout.startswith(f"prepared {tmp_path / 'p'}: ")
        and read_manifest(str(tmp_path / "p")).documents == 60
    )

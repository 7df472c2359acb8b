"""Fixtures the unit tier's training tests share."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """A default process group of one gloo rank for the module (a file rendezvous): what the memory tier's
    collectives need in a single process."""
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()

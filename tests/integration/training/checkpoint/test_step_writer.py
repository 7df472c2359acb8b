"""training.checkpoint.step_writer: DCP's writer for a step directory rank 0 made; it never makes one itself, so a
rank that plans its part after a failed save's directory was removed cannot bring it back without its ownership
file (which the job's next save of that step refused as a directory it did not write)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint.step_writer import StepDirWriter


def test_it_writes_into_the_directory_rank_0_made(tmp_path):
    step = tmp_path / "step_00000002"
    step.mkdir()
    (step / ".t5-failover").write_text("{}")
    dcp.save({"w": torch.arange(4.0)}, storage_writer=StepDirWriter(str(step)), no_dist=True)
    assert (step / ".metadata").is_file() and (step / ".t5-failover").is_file()
    got = {"w": torch.zeros(4)}
    dcp.load(got, checkpoint_id=str(step), no_dist=True)
    assert torch.equal(got["w"], torch.arange(4.0))


def test_a_removed_directory_is_not_made_again(tmp_path):
    step = tmp_path / "step_00000002"  # removed by rank 0 after the save failed elsewhere
    with pytest.raises(CheckpointException) as refused:
        dcp.save({"w": torch.arange(4.0)}, storage_writer=StepDirWriter(str(step)), no_dist=True)
    assert "is gone (its save failed on another rank and was removed): not made again" in str(refused.value)
    assert not step.exists()
    # DCP's own writer makes it (what left a directory without its ownership file behind)
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(step), no_dist=True)
    assert step.is_dir() and not (step / ".t5-failover").exists()

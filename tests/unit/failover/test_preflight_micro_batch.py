"""The launcher's preflight knows the job's MIN..MAX nodes, so it says before any agent starts when a hand-set
train.micro_batch breaks the failover rule (training/job/micro_batch_fit.py): survivors would run larger
micro-batches than the full-size job (more GPU memory after a failure), or a ragged last one."""

from __future__ import annotations

from training.launch.config import LaunchConfig
from training.launch.preflight import preflight

GPU_JOB = dict(min_nodes=1, max_nodes=2, nproc_per_node=8)


def test_the_presets_plan_passes_and_a_larger_micro_batch_is_warned():
    assert preflight(LaunchConfig(**GPU_JOB, train_args=("--preset", "t5-large"))) == []
    warn = preflight(LaunchConfig(**GPU_JOB, train_args=("--preset", "t5-large", "--train.micro_batch", "32")))
    assert len(warn) == 1 and warn[0].startswith("train.micro_batch=32 is above the per-rank share at 16 ranks (16)")


def test_a_world_the_batch_cannot_run_is_said_first_and_the_others_shares_are_checked():
    # global batch 48 on 1..4 nodes x 8: 32 ranks cannot run it (warned); 8, 16 and 24 take 6, 3 and 2 per rank
    warn = preflight(LaunchConfig(min_nodes=1, max_nodes=4, nproc_per_node=8, train_args=(
        "--preset", "t5-large", "--train.global_batch", "48", "--train.micro_batch", "4")))  # fmt: skip
    assert len(warn) == 3 and "does not divide by world sizes [32]" in warn[0]
    assert "above the per-rank share at 24 ranks (2)" in warn[1]
    assert "does not divide the per-rank share at world sizes [8] (6)" in warn[2]

"""The in-place agent's rule (training.launch.inplace_agent.full_restart_reason): only one worker killed by a signal,
with no replacement still joining, is replaced alone; anything else is the group's full restart, said in one line."""

from __future__ import annotations

from training.launch.inplace_agent import full_restart_reason as rule


def test_one_worker_killed_by_a_signal_is_replaced_alone():
    assert rule({1: -9}, None) == "" and rule({0: -15}, None) == ""


def test_anything_else_restarts_the_group_and_says_why():
    assert rule({1: 1}, None) == (
        "worker rank 1 (exit code 1) ended by itself (after its in-place recovery fell back, or an error)"
    )
    assert rule({1: -9, 2: -9}, None) == "2 workers failed at once: rank 1 (SIGKILL), rank 2 (SIGKILL)"
    assert rule({2: -9}, 1) == "rank 2 (SIGKILL) failed while the replacement of rank 1 was joining"
    assert rule({1: 1}, 1) == "the replacement of rank 1 failed (exit code 1)"
    assert rule({1: -99}, 1) == "the replacement of rank 1 failed (signal 99)"

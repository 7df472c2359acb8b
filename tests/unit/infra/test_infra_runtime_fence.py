"""A training pod whose worker group the commit fence stopped (exit 9) is replaced without using a retry: the job
goes on in the newer round, so the pod must neither fail the TrainJob nor count against its index."""

from __future__ import annotations

import pytest

from cluster_assets.k8s.runtime import (
    FENCED_EXIT_CODE,
    NON_RETRYABLE_EXIT_CODES,
    build_cluster_training_runtime,
    replicated_job,
)
from testbed.k8s_emulator import pod_failure_action
from training.errors import EXIT_CODES, StaleGroup
from training.launch.agent import KNOWN_EXIT_CODES


def rules(**overrides: object) -> list[dict]:
    rt = build_cluster_training_runtime(
        name="t5", pvc_name="fsx-claim", image="img:1", max_restarts=3, gpus_per_node=0, efa_per_node=0, **overrides
    )
    return replicated_job(rt, "node")["template"]["spec"]["podFailurePolicy"]["rules"]


def test_the_fenced_exit_code_is_the_one_training_and_its_agent_exit_with():
    assert FENCED_EXIT_CODE == EXIT_CODES[StaleGroup] and FENCED_EXIT_CODE in KNOWN_EXIT_CODES
    assert FENCED_EXIT_CODE not in NON_RETRYABLE_EXIT_CODES


def test_a_fenced_pod_is_ignored_a_crash_counted_a_bad_config_fails_the_job():
    """As the Job controller reads the rules (first match wins: the emulator's implementation of it)."""
    r = rules()
    assert pod_failure_action(r, 9, set(), "default/p")[0] == "Ignore"
    assert pod_failure_action(r, 1, set(), "default/p")[0] == "Count"
    assert pod_failure_action(r, 137, set(), "default/p")[0] == "Count"
    assert pod_failure_action(r, 2, set(), "default/p")[0] == "FailJob"
    # exit 9 of another container (a sidecar) is no fenced worker group
    assert pod_failure_action(r, 9, set(), "default/p", container="sidecar")[0] == "Count"
    # without any non-retryable code the fenced rule stays
    assert pod_failure_action(rules(non_retryable_exit_codes=()), 9, set(), "default/p")[0] == "Ignore"


def test_the_fenced_exit_code_cannot_be_made_non_retryable():
    with pytest.raises(ValueError, match=r"non_retryable_exit_codes \[2, 9\]: 9 is a worker group the commit fence"):
        rules(non_retryable_exit_codes=(2, 9))

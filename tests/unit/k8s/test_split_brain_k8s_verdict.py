"""The Kubernetes split brain's own check and fault, on given evidence: the fenced pod exiting 9 and replaced
uncounted (podFailurePolicy Ignore), the newer group's pod kept, no JobSet restart and the TrainJob Complete passes;
the same run without the Ignore rule (the exit 9 counted, or failing the Job into a gang restart) fails, and so do a
run without the fault and a freeze that never saw a second group. (The fence's own evidence without the fence:
tests/unit/failover/test_split_brain_verdict.py.)"""

import argparse

import pytest

from chaos.kubernetes import FENCED_PODS_REPLACED, check_fenced_pods_replaced, scenario_name
from chaos.split_brain import Freeze
from chaos.verdict import Observation
from testbed.k8s_emulator import Fault


def pod(why: str, exit_code: int) -> dict:
    return {"why": why, "exit_code": exit_code}


def judged(index0: list[dict], index1: list[dict], faulted=("node/0",), restarts=0, state="Complete"):
    facts = {
        "pods": {"node": {"0": index0, "1": index1}},
        "faulted": list(faulted),
        "jobset_restarts": restarts,
        "trainjob_state": state,
    }
    return check_fenced_pods_replaced(Observation(records=[], faults=[], facts=facts))


def test_the_fenced_pod_replaced_uncounted_and_the_trainjob_complete_passes():
    c = judged([pod("created", 9), pod("replaced (Ignore)", 0)], [pod("created", 0)])
    assert c.name == FENCED_PODS_REPLACED and c.ok, c.detail
    assert c.detail.startswith("fenced: node/0 (created, exit 9 -> replaced (Ignore), exit 0); kept: node/1")


def test_without_the_ignore_rule_the_counted_exit_9_fails():
    """podFailurePolicy without the exit-9 rule: the fence's exit counts against the index (Count)."""
    c = judged([pod("created", 9), pod("replaced (Count)", 0)], [pod("created", 0)])
    assert not c.ok and "not one exit 9 then one uncounted replacement" in c.detail


def test_a_gang_restart_fails():
    """Exit 9 sent to FailJob: the JobSet restarts every pod, the newer group's too."""
    c = judged(
        [pod("created", 9), pod("JobSet restart", 0)], [pod("created", 143), pod("JobSet restart", 0)], restarts=1
    )
    assert not c.ok and "1 JobSet restart(s)" in c.detail and "node/1" in c.detail.split("NOT:")[1]


def test_a_failed_trainjob_fails():
    assert not judged([pod("created", 9), pod("replaced (Ignore)", 0)], [pod("created", 0)], state="Failed").ok


def test_a_run_without_the_fault_fails():
    c = judged([pod("created", 0)], [pod("created", 0)], faulted=())
    assert not c.ok and "no fenced group (no fault)" in c.detail


def test_a_freeze_without_a_second_group_is_not_confirmed():
    stopped = {"n0": True}
    assert Freeze({"n0": 1}, stopped, {7: "R"}, second_group_s=2.5).confirmed
    assert not Freeze({"n0": 1}, stopped, {7: "R"}, second_group_s=None).confirmed
    assert not Freeze({"n0": 1}, stopped, {7: "T"}, second_group_s=2.5).confirmed  # the workers stopped too


def test_the_fault_freezes_every_training_pod_and_is_the_catalogs_split_brain():
    f = Fault.parse("freeze-agents:training@3")
    assert (f.kind, f.job, f.at_step) == ("freeze-agents", "training", 3)
    assert scenario_name(f.kind, -1) == "split-brain"
    for wrong in ("freeze-agents:1@3", "freeze-agents:training-1@3", "freeze-agents:etcd-leader@3"):
        with pytest.raises(argparse.ArgumentTypeError, match="write freeze-agents:training@3"):
            Fault.parse(wrong)

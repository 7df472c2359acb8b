"""node-kill-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence that the spare's
workers joined the survivors in place (one attempt, one ``in_place`` record, the surviving nodes' pids kept, as many
new workers as the lost node had, all on the spare), and fails without the fault and on the same loss recovered by a
full restart."""

from __future__ import annotations

from chaos.local.scenarios import scenarios
from chaos.verdict import judge
from tests.unit.failover.test_inplace_verdict import full_restart_records, in_place_records
from tests.unit.failover.test_verdicts import CFG, no_fault_observation

SCENARIO = scenarios(CFG)["node-kill-in-place"]
KEPT = "survivors kept their processes, the lost node's ranks taken by the spare's workers"
KILL_T = CFG.kill_step + 0.5


def loss_facts(after: dict[int, list[int]]) -> dict:
    """Node 1 (pid 12) lost, node 2 the spare."""
    return {"pids": [12], "node": 1, "new_nodes": [2], "before": {0: [11], 1: [12], 2: []}, "after": after}


def failed(obs) -> set[str]:
    return {c.name for c in judge(obs, SCENARIO.expect, SCENARIO.checks).failed()}


def observed(records, after) -> object:
    obs = no_fault_observation("node-kill-in-place")
    obs.records, obs.detections = records, [KILL_T + 2.0]
    obs.facts |= {"in_place_kill": loss_facts(after), "memory_interval": 1}
    return obs


def test_the_spare_joining_in_place_passes():
    v = judge(observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]}), SCENARIO.expect, SCENARIO.checks)
    assert v.passed, v.failed()


def test_without_the_fault_or_with_a_full_restart_or_a_survivor_replaced_it_fails():
    assert KEPT in failed(no_fault_observation("node-kill-in-place"))
    restarted = full_restart_records(KILL_T + 4)
    assert KEPT in failed(observed(restarted, {0: [21], 2: [22]}))  # every worker new: today's full restart
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]})) == {KEPT}  # the survivor too
    assert failed(observed(in_place_records(CFG.kill_step), {0: [11], 2: []})) == {KEPT}  # nobody took rank 1

"""silent-node-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence that the spare's
workers took the silent node's ranks in place (one attempt, an ``in_place`` record, as many new workers on the
spare as the silent node had) and that every surviving worker either kept its pid or was killed by its own agent
as blocked by the lost node and replaced alone; it fails without the fault, on a full restart, and when a
survivor's process changed with no such kill said."""

from __future__ import annotations

from chaos.local.scenarios import BLOCKED_KILL_LINE, scenarios
from chaos.verdict import judge
from tests.unit.failover.test_inplace_verdict import full_restart_records, in_place_records
from tests.unit.failover.test_verdicts import CFG, no_fault_observation

SCENARIO = scenarios(CFG)["silent-node-in-place"]
TAKEN = "the lost node's ranks taken by the spare's workers, the survivors kept or replaced alone, no restart"
STOP_T = CFG.kill_step + 0.5


def silent_facts(after: dict[int, list[int]]) -> dict:
    """Node 1 (pid 12) silent, node 2 the spare; node 0 ran pid 11."""
    return {"pids": [12], "node": 1, "new_nodes": [2], "before": {0: [11], 1: [12], 2: []}, "after": after}


def blocked_kill(pid: int) -> tuple[float, str]:
    """Node 0's agent's line for its worker ``pid`` (training.launch.inplace_agent)."""
    return (
        STOP_T + 2.3,
        f"[agent] in-place: worker rank 0 (pid {pid}) has not checked in to epoch 2 0.3 s {BLOCKED_KILL_LINE}",
    )


def failed(obs) -> set[str]:
    return {c.name for c in judge(obs, SCENARIO.expect, SCENARIO.checks).failed()}


def observed(records, after, logs=()) -> object:
    obs = no_fault_observation("silent-node-in-place")
    obs.records, obs.detections, obs.logs = records, [STOP_T + 2.0], list(logs)
    obs.facts |= {"in_place_kill": silent_facts(after), "memory_interval": 1}
    return obs


def test_the_spare_joining_with_the_blocked_survivor_replaced_passes():
    v = judge(
        observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]}, [blocked_kill(11)]),
        SCENARIO.expect,
        SCENARIO.checks,
    )
    assert v.passed, v.failed()
    v = judge(observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]}), SCENARIO.expect, SCENARIO.checks)
    assert v.passed, v.failed()  # a survivor that was not blocked keeps its process (NCCL's abort, on a GPU)


def test_without_the_fault_or_with_a_full_restart_or_an_unexplained_new_survivor_it_fails():
    assert TAKEN in failed(no_fault_observation("silent-node-in-place"))
    restarted = full_restart_records(STOP_T + 4)
    assert TAKEN in failed(observed(restarted, {0: [21], 2: [22]}, [blocked_kill(11)]))  # a new attempt
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]})) == {TAKEN}  # no kill said
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: []}, [blocked_kill(11)])) == {TAKEN}
    early = [(STOP_T - 1.0, blocked_kill(11)[1])]  # a kill line from before the stop is not this fault's
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]}, early)) == {TAKEN}

"""silent-node-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence that the spare's
workers took the silent node's ranks in place (one attempt, an ``in_place`` record, as many new workers on the
spare as the silent node had) and that the survivors' blocked collective was cut in their processes (a worker's
cut line after the stop, every survivor's pid kept); it fails without the fault, on a full restart, when a
survivor's process changed (with or without its agent's kill as blocked: the fall-back, which keeps the job going
but not the process), and when no cut was said."""

from __future__ import annotations

from chaos.local.scenarios import BLOCKED_KILL_LINE, CUT_LINE, scenarios
from chaos.verdict import judge
from tests.unit.failover.test_inplace_verdict import full_restart_records, in_place_records
from tests.unit.failover.test_verdicts import CFG, no_fault_observation

SCENARIO = scenarios(CFG)["silent-node-in-place"]
TAKEN = "the lost node's ranks taken by the spare's workers, the survivors kept or replaced alone, no restart"
CUT = "the survivors' blocked collective cut in their processes, every survivor's pid kept"
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


def cut(member: str = "r00000-vm-11") -> tuple[float, str]:
    """Node 0's worker's line when it cut its group (training.job.inplace.group)."""
    return (STOP_T + 2.2, f"[inplace] epoch 1: {member} {CUT_LINE} (a node was lost: epoch 2 is forming without it)")


def test_the_spare_joining_with_the_blocked_survivors_collective_cut_passes():
    v = judge(observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]}, [cut()]), SCENARIO.expect, SCENARIO.checks)
    assert v.passed, v.failed()


def test_without_the_fault_or_with_a_full_restart_or_a_survivor_replaced_or_no_cut_it_fails():
    assert {TAKEN, CUT} <= failed(no_fault_observation("silent-node-in-place"))
    restarted = full_restart_records(STOP_T + 4)
    assert TAKEN in failed(observed(restarted, {0: [21], 2: [22]}, [blocked_kill(11)]))  # a new attempt
    # the agent's fall-back: the blocked survivor killed and replaced (the job goes on, its process does not)
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]}, [blocked_kill(11)])) == {CUT}
    assert failed(observed(in_place_records(CFG.kill_step), {0: [21], 2: [13]}, [cut()])) == {TAKEN, CUT}
    assert failed(observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]})) == {CUT}  # kept, but no cut said
    assert failed(observed(in_place_records(CFG.kill_step), {0: [11], 2: []}, [cut()])) == {TAKEN}  # no spare
    early = [(STOP_T - 1.0, cut()[1])]  # a cut from before the stop is not this fault's
    assert failed(observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]}, early)) == {CUT}

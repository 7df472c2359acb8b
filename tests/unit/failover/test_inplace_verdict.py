"""worker-kill-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence of an in-place
recovery (one attempt, one ``in_place`` record, the survivors' pids kept and one new worker, the resume step), and
fails on a run without the fault and on the same kill recovered by a full restart."""

from __future__ import annotations

from chaos.local.scenarios import scenarios
from chaos.verdict import judge
from tests.unit.failover.test_verdicts import CFG, no_fault_observation, start, step

SCENARIO = scenarios(CFG)["worker-kill-in-place"]
KILL_T = CFG.kill_step + 0.5
IN_PLACE_CHECKS = {"survivors kept their processes, one worker replaced", "steps recomputed in place <= 1"}


def in_place_records(resumed: int) -> list[dict]:
    """Rank 0's records: the kill after step kill_step, the survivors' recovery, the steps from ``resumed`` on."""
    recovered = {"event": "in_place", "time": KILL_T + 1.0, "held_step": CFG.kill_step, "resumed_from": resumed}
    recovered |= {"restored_from": {"tier": "memory", "step": resumed}, "seconds": 0.8, "epoch": 2}
    return (
        [start(0)]
        + [step(n, n) for n in range(1, CFG.kill_step + 1)]
        + [recovered]
        + [step(KILL_T + 1.5 + n - resumed - 1, n) for n in range(resumed + 1, CFG.steps + 1)]
        + [{"event": "end", "time": 40, "step": CFG.steps}]
    )


def full_restart_records(restart_at: float) -> list[dict]:
    """Rank 0's records of the same fault recovered by today's full restart: a second attempt starting at
    ``restart_at``, resumed from the kill step's snapshot."""
    return (
        [start(0)]
        + [step(n, n) for n in range(1, CFG.kill_step + 1)]
        + [dict(start(restart_at, CFG.kill_step, restart=1), restored_from={"tier": "memory"})]
        + [step(restart_at + 1 + n, n) for n in range(CFG.kill_step + 1, CFG.steps + 1)]
        + [{"event": "end", "time": 40, "step": CFG.steps}]
    )


def kill_facts(after: dict[int, list[int]]) -> dict:
    return {"pid": 12, "node": 1, "before": {0: [11], 1: [12]}, "after": after, "memory_interval": 1}


def failed(obs) -> set[str]:
    return {c.name for c in judge(obs, SCENARIO.expect, SCENARIO.checks).failed()}


def test_the_in_place_evidence_passes():
    obs = no_fault_observation("worker-kill-in-place")
    obs.records, obs.detections = in_place_records(CFG.kill_step - 1), [KILL_T + 0.1]
    obs.facts["in_place_kill"] = kill_facts({0: [11], 1: [13]})
    v = judge(obs, SCENARIO.expect, SCENARIO.checks)
    assert v.passed, v.failed()
    detail = next(c.detail for c in v.checks if c.name == "steps recomputed in place <= 1")
    assert "1 recomputed" in detail and "kill -> survivors' next step 1.50 s" in detail


def test_without_the_fault_the_in_place_checks_fail():
    obs = no_fault_observation("worker-kill-in-place")  # the fault claimed, nothing happened
    assert IN_PLACE_CHECKS <= failed(obs)


def test_a_full_restart_or_a_survivor_replaced_fails():
    obs = no_fault_observation("worker-kill-in-place")
    obs.detections = [KILL_T + 0.1]
    obs.records = full_restart_records(KILL_T + 2)
    obs.facts["in_place_kill"] = kill_facts({0: [21], 1: [22]})  # every worker new
    assert IN_PLACE_CHECKS <= failed(obs)
    obs.records = in_place_records(CFG.kill_step)
    obs.facts["in_place_kill"] = kill_facts({0: [21], 1: [13]})  # the survivor's process replaced too
    assert failed(obs) == {"survivors kept their processes, one worker replaced"}
    obs.facts["in_place_kill"] = kill_facts({0: [11], 1: [13]})
    obs.records = in_place_records(CFG.kill_step - 2)  # two steps recomputed: beyond the snapshot interval
    assert failed(obs) == {"steps recomputed in place <= 1"}


def test_a_survivor_its_agent_replaced_as_blocked_counts_only_with_its_line():
    """2 nodes x 2 workers: rank 1 (pid 12, node 0) killed; pid 14 on node 1 left blocked on survivors that left the
    old group (gloo) and replaced by its own agent, which says so after the kill naming its pid."""
    kept = "survivors kept their processes, one worker replaced"
    obs = no_fault_observation("worker-kill-in-place")
    obs.records, obs.detections = in_place_records(CFG.kill_step), [KILL_T + 0.1]
    before, after = {0: [11, 12], 1: [13, 14]}, {0: [11, 15], 1: [13, 16]}
    obs.facts["in_place_kill"] = {"pid": 12, "node": 0, "before": before, "after": after, "memory_interval": 1}
    assert kept in failed(obs)  # no line: a survivor replaced
    line = "[agent] in-place: worker rank 3 (pid 14) has not checked in to epoch 2 1.0 s after its peers did "
    obs.logs = [(KILL_T + 1.2, line + "(blocked in a collective its backend cannot cut): killed, to be replaced")]
    assert kept not in failed(obs)
    obs.facts["in_place_kill"]["after"] = {0: [11, 15, 16], 1: [13]}  # its replacement on the wrong node
    assert kept in failed(obs)
    obs.facts["in_place_kill"]["after"] = after
    obs.logs = [(KILL_T - 3.0, obs.logs[0][1])]  # a line from before the kill is not this fault's
    assert kept in failed(obs)

"""straggler-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence that the straggler's
node left on purpose and the survivors recovered in place for it (their ``in_place`` record names a straggler's node
leaving, their pids kept, the spare's worker in its ranks), and fails without the fault, on today's full restart and
on a peer lost instead."""

from __future__ import annotations

from chaos.local.scenarios import STRAGGLER_LEFT_FAILED, check_straggler_left_in_place, scenarios
from chaos.verdict import judge
from tests.unit.failover.test_inplace_node_verdict import KEPT, loss_facts
from tests.unit.failover.test_inplace_verdict import full_restart_records, in_place_records
from tests.unit.failover.test_verdicts import CFG, no_fault_observation

SCENARIO = scenarios(CFG)["straggler-in-place"]
LEFT = "the straggler's node left, the survivors recovered in place for it"
T = CFG.kill_step + 0.5
AGENT_LEFT = "[agent] this node left the job: rank 1 (node 1, host vm) is a straggler: x3.4 the others' median"


def observed(records, after, *, failed_line: str, logs=((T + 1.2, AGENT_LEFT),)):
    obs = no_fault_observation("straggler-in-place")
    for r in records:
        if r.get("event") == "in_place":
            r["failed"] = failed_line
    obs.records, obs.detections, obs.logs = records, [T + 0.5], list(logs)
    obs.facts |= {"in_place_kill": loss_facts(after), "memory_interval": 1}
    return obs


def names_failed(obs) -> set[str]:
    return {c.name for c in judge(obs, SCENARIO.expect, SCENARIO.checks).failed()}


def test_the_straggler_leaving_and_the_survivors_recovering_in_place_passes_its_checks():
    obs = observed(
        in_place_records(CFG.kill_step), {0: [11], 2: [13]}, failed_line=f"{STRAGGLER_LEFT_FAILED}: rank 1 (node 1)"
    )
    assert check_straggler_left_in_place(obs).ok
    assert {LEFT, KEPT}.isdisjoint(names_failed(obs))


def test_without_the_fault_after_a_full_restart_or_a_lost_peer_it_fails():
    assert {LEFT, KEPT} <= names_failed(no_fault_observation("straggler-in-place"))
    restarted = observed(full_restart_records(T + 4), {0: [21], 2: [22]}, failed_line="")  # today's Regroup path
    assert {LEFT, KEPT} <= names_failed(restarted)
    lost_peer = observed(in_place_records(CFG.kill_step), {0: [11], 2: [13]}, failed_line="RuntimeError: gloo")
    assert not check_straggler_left_in_place(lost_peer).ok  # recovered in place, but not for a straggler
    silent = observed(
        in_place_records(CFG.kill_step), {0: [11], 2: [13]}, failed_line=f"{STRAGGLER_LEFT_FAILED}: x", logs=()
    )
    assert not check_straggler_left_in_place(silent).ok  # no agent said its node left the job

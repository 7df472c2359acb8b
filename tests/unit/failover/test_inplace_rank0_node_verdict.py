"""first-node-kill-in-place's verdict (chaos/local/scenarios.py): it passes only on the job's evidence that the spare's
worker took rank 0 in place (one attempt, one ``in_place`` record written by a joiner, the survivor's pid kept and
its state kept live in its old rank, the new worker on the spare), and fails without the fault, on a full restart,
and on the old in-place order, in which the survivor moved to rank 0 and read its state back."""

from __future__ import annotations

from chaos.local.scenarios import scenarios
from chaos.verdict import judge
from tests.unit.failover.test_inplace_verdict import full_restart_records, in_place_records
from tests.unit.failover.test_verdicts import CFG, no_fault_observation

SCENARIO = scenarios(CFG)["first-node-kill-in-place"]
KEPT = "survivors kept their processes, the lost node's ranks taken by the spare's workers"
RANK0 = "rank 0 taken by the spare's worker, the survivors' shards kept where they were"
KILL_T = CFG.kill_step + 0.5


def loss_facts(after: dict[int, list[int]]) -> dict:
    """Node 0 (rank 0, pid 11) lost, node 2 the spare."""
    return {"pids": [11], "node": 0, "new_nodes": [2], "before": {0: [11], 1: [12], 2: []}, "after": after}


def joined_records(sources: list[str], joined: bool = True) -> list[dict]:
    """The new rank 0's records: its recovery record (a joiner's: no held step) and the steps after."""
    records = in_place_records(CFG.kill_step)
    for r in records:
        if r.get("event") == "in_place":
            r |= {"joined": joined, "sources": sources, "world_size": 2, "agreed_step": CFG.kill_step}
            if joined:
                r["held_step"] = None
    return records


def observed(records, after) -> object:
    obs = no_fault_observation("first-node-kill-in-place")
    obs.records, obs.detections = records, [KILL_T + 0.4]
    obs.facts |= {"in_place_kill": loss_facts(after), "memory_interval": 1}
    return obs


def failed(obs) -> set[str]:
    return {c.name for c in judge(obs, SCENARIO.expect, SCENARIO.checks).failed()}


def test_the_spares_worker_taking_rank_0_in_place_passes():
    obs = observed(joined_records(["peer", "live"]), {1: [12], 2: [13]})
    obs.facts["run_lock_holder"] = 13  # the new rank 0 took the run lock
    v = judge(obs, SCENARIO.expect, SCENARIO.checks)
    assert v.passed, v.failed()
    detail = next(c.detail for c in v.checks if c.name == RANK0)
    assert "written by a joiner: True" in detail and "['peer', 'live']" in detail and "held by pid 13" in detail


def test_the_run_lock_left_with_the_lost_rank_0_fails():
    for holder in (11, None):  # the lost process's record in the lock file, or no holder at all
        obs = observed(joined_records(["peer", "live"]), {1: [12], 2: [13]})
        obs.facts["run_lock_holder"] = holder
        assert failed(obs) == {RANK0}


def test_without_the_fault_on_a_full_restart_or_with_the_survivor_moved_to_rank_0_it_fails():
    assert {KEPT, RANK0} <= failed(no_fault_observation("first-node-kill-in-place"))
    restarted = full_restart_records(KILL_T + 4)
    assert {KEPT, RANK0} <= failed(observed(restarted, {1: [21], 2: [22]}))  # every worker new: a full restart
    # the order before: the survivor took rank 0 (its record not a joiner's) and read its shards back re-cut
    assert failed(observed(joined_records(["own", "peer"], joined=False), {1: [12], 2: [13]})) == {RANK0}
    # a survivor that read its state back although it kept its rank
    assert failed(observed(joined_records(["peer", "own"]), {1: [12], 2: [13]})) == {RANK0}


def test_a_survivor_replaced_as_blocked_by_its_agent_may_restore_its_state():
    """The Slurm lab's node kill takes the link down: the survivor's gloo collective blocks, its agent replaces it
    (its line names it), and the replacement restores its shard like any other."""
    from chaos.local.scenarios import BLOCKED_KILL_LINE

    obs = observed(joined_records(["own", "own"]), {1: [14], 2: [13]})
    assert RANK0 in failed(obs)  # no blocked kill said: the survivor should have kept its state
    obs.logs = [(KILL_T + 2.5, f"[agent] in-place: worker rank 1 (pid 12) has not checked in ... {BLOCKED_KILL_LINE}")]
    assert RANK0 not in failed(obs)
    obs.logs = [(KILL_T - 5, f"[agent] in-place: worker rank 1 (pid 12) ... {BLOCKED_KILL_LINE}")]  # before the kill
    assert RANK0 in failed(obs)


def test_ranks_rolled_back_a_step_restore_it_and_that_passes():
    """The lost rank's snapshot of the held step was in flight: the agreed step is one back and every rank restores
    it (a survivor too: its live state is a step ahead)."""
    records = joined_records(["storage", "storage"])
    for r in records:
        if r.get("event") == "in_place":
            r["agreed_step"] = CFG.kill_step + 1
    assert RANK0 not in failed(observed(records, {1: [12], 2: [13]}))

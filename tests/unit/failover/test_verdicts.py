"""Every chaos verdict needs its fault: a run in which nothing happened fails every scenario on every platform.

The observation of an uninterrupted run is judged as each scenario would judge it, with the fault recorded by
the harness as if it had been injected and *confirmed* (a harness that lies). The verdict must still fail, and
on the job's own evidence (nothing noticed a failure, no restart, no signal, no fallback), not only because the
fault is missing. The same observation with the fault's effects passes, so the checks are not simply broken.
The e2e variant judges a real uninterrupted run (tests/e2e/failover/test_chaos_e2e.py).
"""

from __future__ import annotations

import pytest

from chaos import catalog
from chaos.local.config import LocalChaosConfig
from chaos.local.scenarios import base_facts, scenarios
from chaos.verdict import Expectation, Fault, Observation, judge

CFG = LocalChaosConfig()
GB = CFG.global_batch
JOB_EVIDENCE = {
    "failure noticed",
    "job restarted",
    "shrank and grew back",
    "checkpoint on signal, clean exit",
    "partial checkpoint ignored",
    "corrupt checkpoint skipped with a warning",
    "rank 0's node killed, job re-formed on the membership store",
    "every restart used, then the job stopped",
    "job stopped with an error",
    "clear failure message",
    "previous snapshot used",
    "fell back to storage (a shard and its replica lost)",
    "silent node declared (its keep-alives or heartbeats stopped)",
    "hot spare took the lost node's place",
    "damaged own snapshot skipped for the peer replica",
    "damaged own snapshot and replica: storage restored, named",
    # the store scenarios: what the agents logged (rounds formed, "store unreachable"), and which member
    # etcd itself reports as leader after the kill (asked of etcd, not claimed by the harness)
    "no restart: the job trained through the store's fault",
    "training went on with the store down",
    "etcd leader killed, another member leads",
    "re-formed once the store was back",
    "wedged rank declared and killed by its agent",
    # straggler: the job's own straggler event, and the slow node's agent saying it left
    "straggler named on the slow node",
    "the straggler's node left, the hot spare took its place",
}


# corrupt-snapshot's two faults as its harness records them: rank 1 frozen, damaged, SIGKILLed at these times
SNAPSHOT_DAMAGE = [
    {
        "rank": 1,
        "step": CFG.kill_step,
        "replica": False,
        "time": CFG.kill_step + 0.5,
        "damaged": [("own", CFG.kill_step)],
    },
    {
        "rank": 1,
        "step": 2 * CFG.interval + 1,
        "replica": True,
        "time": 20.5,
        "damaged": [("own", 8), ("own", 9), ("peer", 8), ("peer", 9)],
    },
]


def start(t, resumed=None, world=2, restart=0):
    return {"event": "start", "time": t, "world_size": world, "restart_count": restart, "resumed_from": resumed}


def step(t, n, world=2):
    return {
        "event": "step",
        "time": t,
        "step": n,
        "loss": 10.0 - n,
        "world_size": world,
        "step_time_s": 1.0,
        "data_offset": (n - 1) * GB,
    }


def uninterrupted(steps=CFG.steps):
    recs = [start(0)] + [step(n, n) for n in range(1, steps + 1)]
    recs += [{"event": "checkpoint", "time": n + 0.5, "step": n} for n in range(CFG.interval, steps + 1, CFG.interval)]
    return sorted(recs, key=lambda r: r["time"]) + [{"event": "end", "time": steps + 1, "step": steps}]


def no_fault_observation(name: str) -> Observation:
    """An uninterrupted run, with the scenario's fault *claimed* at the kill step and its facts filled in."""
    t = CFG.kill_step + 0.5
    facts = {
        **base_facts(CFG),
        "rank0_node": 0,
        "killed_node": 0,
        "store_alive_at_end": True,
        "partial_checkpoint": "step_00000008",
        "corrupt_checkpoint": "step_00000008",
        "max_restarts": 1,
        "truncated": {"file": "step_00000008/__0_0.distcp", "from": 100, "to": 50},
        "snapshot_kill_step": CFG.kill_step,
        "memory_interval": CFG.memory_interval,
        "killed_nodes": [1, 2],
        "silent_ranks": [1],
        "silent_agent_pid": 4242,
        "spare_nodes": [2],
        "spare_ranks_after": [],
        "snapshot_damage": SNAPSHOT_DAMAGE,
        "slow_ranks": [1],
        "slow_until": t + 10,
        "wedge": {"step": CFG.kill_step, "rank": 1, "pid": 77, "time": t},
    }
    return Observation(
        records=uninterrupted(),
        faults=[Fault(name, t, True, "claimed by a lying harness")],
        rejoins=[t + 3] if name in ("node-loss-rejoin", "silent-node") else [],
        exited_ok=True,
        exit_detail="exit codes {'node0': 0, 'node1': 0}",
        steps=CFG.steps,
        global_batch=GB,
        final_committed=True,
        weight_diffs=[],
        reference_records=uninterrupted(),
        wall_s=20.0,
        logs=[(1.0, "step 1/16 loss 9.0")],
        facts=facts,
    )


@pytest.mark.parametrize("name", catalog.PLATFORMS["local"])
def test_local_verdict_fails_without_its_fault(name):
    sc = scenarios(CFG)[name]
    v = judge(no_fault_observation(name), sc.expect, sc.checks)
    failed = {c.name for c in v.failed()}
    assert not v.passed, f"{name} passed on a run with no fault: {v.checks}"
    assert "fault injected" not in failed  # the harness claimed it: the job's own evidence must be what fails
    assert failed & JOB_EVIDENCE, f"{name} failed only on {failed}"


@pytest.mark.parametrize("name", catalog.PLATFORMS["local"])
def test_unconfirmed_fault_fails_the_verdict(name):
    sc = scenarios(CFG)[name]
    obs = no_fault_observation(name)
    obs.faults = [Fault(name, obs.faults[0].time, False, "pid 123 still running 5 s after SIGKILL")]
    failed = {c.name: c.detail for c in judge(obs, sc.expect, sc.checks).failed()}
    assert "still running" in failed["fault injected"]


def test_worker_kill_passes_with_its_evidence():
    """The same run with a real kill's traces (detection, restart from the step-5 memory snapshot, step 6
    recomputed) passes; restarting from the step-4 storage checkpoint instead (2 lost) misses the bound."""

    def killed(resumed: int, tier: str) -> list[dict]:
        return (
            [start(0)]
            + [step(n, n) for n in range(1, 7)]
            + [{"event": "checkpoint", "time": 4.5, "step": 4}]
            + [dict(start(10, resumed, restart=1), restored_from={"tier": tier, "step": resumed})]
            + [step(10 + n, n) for n in range(resumed + 1, CFG.steps + 1)]
            + [{"event": "end", "time": 30, "step": CFG.steps}]
        )

    obs = no_fault_observation("worker-kill")
    obs.records, obs.detections = killed(5, "memory"), [6.6]
    v = judge(obs, scenarios(CFG)["worker-kill"].expect)
    assert v.passed, v.failed()
    (r,) = v.recoveries
    assert r.steps_lost == 1 and r.tier == "memory" and r.detect_s == pytest.approx(0.1)
    assert r.recover_s == pytest.approx(16 - 6.5)
    assert "1 step(s) recomputed (state from memory)" in next(c.detail for c in v.checks if c.name == "job restarted")
    obs.records = killed(4, "storage")
    failed = {c.name: c.detail for c in judge(obs, scenarios(CFG)["worker-kill"].expect).failed()}
    assert failed == {"steps recomputed <= 1": "steps recomputed per fault: [2]"}


def test_steps_lost_bound_and_unequal_weights_fail():
    recs = (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + [start(10, 0, restart=1)]
        + [step(10 + n, n) for n in range(1, CFG.steps + 1)]
        + [{"event": "end", "time": 40, "step": CFG.steps}]
    )
    obs = no_fault_observation("worker-kill")
    obs.records, obs.detections, obs.weight_diffs = recs, [6.6], ["model.shared.weight: max |diff| 1e-3"]
    failed = {c.name for c in judge(obs, Expectation(max_steps_lost=2)).failed()}
    assert failed == {"steps recomputed <= 2", "weights bitwise == reference"}


def test_exactly_once_and_history_problems_fail():
    obs = no_fault_observation("worker-kill")
    recs = (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + [start(10, 4, restart=1)]
        + [dict(step(10 + n, n), data_offset=(n - 2) * GB) for n in range(5, CFG.steps + 1)]
        + [{"event": "end", "time": 40, "step": CFG.steps}]
    )
    obs.records, obs.detections = recs, [6.6]
    failed = {c.name: c.detail for c in judge(obs, Expectation()).failed()}
    assert "overlap" in failed["every sample exactly once"]


def test_broken_reference_history_skips_the_loss_check_instead_of_crashing():
    obs = no_fault_observation("worker-kill")
    obs.reference_records = [start(0), step(1, 1), step(2, 3)]  # step 2 missing
    names = {c.name for c in judge(obs, Expectation(restart=False, noticed=False)).checks}
    assert "losses == reference" not in names and "weights bitwise == reference" in names


def restarted(resumed: int, tier: str) -> list[dict]:
    """Killed after step 6, restarted from `resumed` (restored from `tier`), finished."""
    return (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + [{"event": "checkpoint", "time": 4.5, "step": 4}]
        + [dict(start(10, resumed, restart=1), restored_from={"tier": tier, "step": resumed})]
        + [step(10 + n, n) for n in range(resumed + 1, CFG.steps + 1)]
        + [{"event": "end", "time": 30, "step": CFG.steps}]
    )


def test_kill_mid_snapshot_passes_only_when_the_step_before_the_killed_copy_is_restored():
    from chaos.local.scenarios import check_previous_snapshot_used

    obs = no_fault_observation("kill-mid-snapshot")
    obs.records = restarted(CFG.kill_step - 1, "memory")
    assert check_previous_snapshot_used(obs).ok
    obs.records = restarted(CFG.kill_step, "memory")  # the half-written generation was offered
    assert not check_previous_snapshot_used(obs).ok
    obs.records = restarted(4, "storage")
    assert not check_previous_snapshot_used(obs).ok


def test_node_pair_loss_passes_only_on_a_storage_restore_of_two_killed_nodes_with_the_reason():
    from chaos.local.scenarios import check_fell_back_to_storage

    obs = no_fault_observation("node-pair-loss")
    obs.faults = [Fault("SIGKILL 2 nodes", obs.faults[0].time, True, "node1, node2: agents and workers gone")]
    obs.records = restarted(4, "storage")
    obs.logs = [(obs.faults[0].time + 2, "memory snapshots: no step complete for every shard (world size 3; ...)")]
    assert check_fell_back_to_storage(obs).ok
    obs.records = restarted(5, "peer")  # memory could not have had every shard: a replica was found
    assert not check_fell_back_to_storage(obs).ok
    obs.records, obs.facts = restarted(4, "storage"), {**obs.facts, "killed_nodes": [1]}  # one node only
    assert not check_fell_back_to_storage(obs).ok


def test_silent_node_passes_only_when_the_job_named_the_stopped_node():
    from chaos.local.scenarios import check_silent_node_declared

    obs = no_fault_observation("silent-node")
    t = obs.faults[0].time
    obs.records = restarted(CFG.kill_step, "peer")
    obs.facts = {**obs.facts, "silent_agent_pid": 4242}
    watchdog = (
        t + 5.2,
        "[watchdog] rank 0: rank 1 (node 1, host vm, pid 77) has sent no heartbeat for 5.0 s "
        "(parallel.heartbeat_timeout_s 5); ending this worker so the job re-forms without it",
    )
    lost = (
        t + 3.1,
        "[agent] lost node(s) of this round: vm (agent pid 4242), last keep-alive 3.6 s ago (limit 3 s): "
        "restarting now; this node's workers are SIGKILLed, as their collectives with the lost node "
        "cannot finish",
    )
    obs.logs = [watchdog]
    assert check_silent_node_declared(obs).ok
    obs.logs = [lost]  # the agents' keep-alive check found it first
    assert check_silent_node_declared(obs).ok
    obs.facts = {**obs.facts, "silent_agent_pid": 4243}  # the lost-node line names another node's agent
    assert not check_silent_node_declared(obs).ok
    obs.facts, obs.logs = {**obs.facts, "silent_ranks": [0]}, [watchdog]  # the line names a rank not stopped
    assert not check_silent_node_declared(obs).ok
    obs.facts, obs.logs = {**obs.facts, "silent_ranks": [1]}, []  # a collective timeout found it
    assert not check_silent_node_declared(obs).ok


def test_wedged_rank_passes_only_when_its_own_line_named_it_and_its_agent_killed_that_worker():
    from chaos.local.scenarios import check_wedge_declared

    obs = no_fault_observation("wedged-rank")
    t = obs.faults[0].time
    obs.records, obs.detections = restarted(CFG.kill_step - 1, "memory"), [t + 4.2]
    wedged = (
        t + 4.0,
        "[node1] [watchdog] rank 1 (node 1, pid 77) is wedged: no progress in phase forward_backward "
        f"of step {CFG.kill_step} for 3.1 s (bound 3.0 s: max(floor 3 s, 4 x slowest 0.21 s)); its "
        "agent SIGKILLs it so the job restarts",
    )
    killed = (
        t + 4.3,
        "[node1] [agent] worker pid 77 (rank 1) declared itself wedged (its line above): SIGKILLed it "
        "so this node restarts at once",
    )
    obs.logs = [wedged, killed]
    v = judge(obs, scenarios(CFG)["wedged-rank"].expect, scenarios(CFG)["wedged-rank"].checks)
    assert v.passed, v.failed()
    check = check_wedge_declared(obs)
    assert "is wedged" in check.detail and "next step" in check.detail and "target <= 10 s" in check.detail
    obs.logs = [killed]  # no wedge verdict: the process-group timeout (or anything else) ended it
    assert not check_wedge_declared(obs).ok
    obs.logs = [wedged]  # declared, but its agent never killed it
    assert not check_wedge_declared(obs).ok
    obs.logs = [(t - 1, wedged[1]), (t - 1, killed[1])]  # lines from before the fault are not its evidence
    assert not check_wedge_declared(obs).ok
    obs.logs, obs.facts = [wedged, killed], {**obs.facts, "wedge": {**obs.facts["wedge"], "rank": 0}}
    assert not check_wedge_declared(obs).ok  # the line names another rank than the one blocked


def test_spare_verdict_needs_the_spare_to_host_ranks_at_an_unchanged_world_size():
    from chaos.local.scenarios import check_spare_took_over

    obs = no_fault_observation("node-kill-with-spare")
    obs.records = restarted(CFG.kill_step, "peer")
    obs.facts = {**obs.facts, "spare_ranks_after": [1]}
    assert check_spare_took_over(obs).ok
    shrunk = [
        dict(r, world_size=1) if r.get("event") == "step" and r["time"] > obs.faults[0].time else r for r in obs.records
    ]
    obs.records = shrunk  # the job went on without the spare, at a smaller world
    assert not check_spare_took_over(obs).ok
    obs.records, obs.facts = restarted(CFG.kill_step, "peer"), {**obs.facts, "spare_ranks_after": []}
    assert not check_spare_took_over(obs).ok  # restarted at full size, but not on the spare


def corrupt_snapshot_run(first: dict, second: dict) -> list[dict]:
    """Damaged and killed after step 6 (t 6.5), restored as `first`; again after step 9 (t 20.5), restored as
    `second`; finished."""
    a, b = first["step"], second["step"]
    return (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + [{"event": "checkpoint", "time": 4.5, "step": 4}]
        + [dict(start(10, a, restart=1), restored_from=first)]
        + [step(10 + n - a, n) for n in range(a + 1, 10)]
        + [{"event": "checkpoint", "time": 12.5, "step": 8}]
        + [dict(start(30, b, restart=2), restored_from=second)]
        + [step(30 + n - b, n) for n in range(b + 1, 17)]
        + [{"event": "end", "time": 60, "step": CFG.steps}]
    )


def test_corrupt_snapshot_passes_only_on_the_replica_then_storage_with_each_damaged_copy_named():
    from chaos.local.scenarios import (
        check_damaged_own_copy_replaced_by_replica,
        check_damaged_replica_falls_back_to_storage,
    )

    obs = no_fault_observation("corrupt-snapshot")
    peer = {"tier": "peer", "step": 6, "skipped": [{"copy": "own", "rank": 1, "step": 6}]}
    storage = {
        "tier": "storage",
        "step": 8,
        "skipped": [{"copy": "own", "rank": 1, "step": 9}, {"copy": "peer", "rank": 1, "step": 9}],
    }
    obs.records = corrupt_snapshot_run(peer, storage)
    obs.logs = [
        (
            11.0,
            "WARNING: damaged memory snapshot (found before restoring it): the own-node copy of rank 1's "
            "shard of step 6 (world size 2), host:/shm/own-r1-w2.0.data: CRC32C expected a, found b",
        ),
        (
            31.0,
            "memory snapshots not used; skipped as damaged (CRC32C mismatch, moved to quarantine): rank 1's "
            "own-node copy of step 9, rank 1's peer replica of step 9: ...",
        ),
    ]
    assert check_damaged_own_copy_replaced_by_replica(obs).ok
    assert check_damaged_replica_falls_back_to_storage(obs).ok
    # the damaged step loaded from its own copy as if nothing happened (today's behaviour): both fail
    obs.records = corrupt_snapshot_run({"tier": "memory", "step": 6}, {"tier": "memory", "step": 9})
    assert not check_damaged_own_copy_replaced_by_replica(obs).ok
    assert not check_damaged_replica_falls_back_to_storage(obs).ok
    # the right tiers, but nothing named what was skipped
    obs.records = corrupt_snapshot_run({"tier": "peer", "step": 6}, {"tier": "storage", "step": 8})
    assert not check_damaged_own_copy_replaced_by_replica(obs).ok
    assert not check_damaged_replica_falls_back_to_storage(obs).ok
    obs.records, obs.logs = corrupt_snapshot_run(peer, storage), []  # the skips recorded but never said in the log
    assert not check_damaged_own_copy_replaced_by_replica(obs).ok
    assert not check_damaged_replica_falls_back_to_storage(obs).ok


def test_store_scenarios_pass_only_with_their_evidence():
    """store-member-kill needs another leader and one round; store-outage needs steps logged while every member
    was stopped and the agents saying so; the worker killed in an outage needs an attempt trained after it."""
    rounds0 = [(1.0, "[rendezvous] round 0: rank 0 of 2 node(s)"), (1.0, "[rendezvous] round 0: rank 1 of 2 node(s)")]
    obs = no_fault_observation("store-member-kill")
    obs.logs = rounds0
    obs.facts["store_killed"] = {"member": "m1", "pid": 7, "new_leader": "m0"}
    sc = scenarios(CFG)["store-member-kill"]
    assert judge(obs, sc.expect, sc.checks).passed
    obs.logs = rounds0 + [(9.0, "[rendezvous] round 1: rank 0 of 2 node(s)")]  # a restart: the fault cost a round
    assert {c.name for c in judge(obs, sc.expect, sc.checks).failed()} == {
        "no restart: the job trained through the store's fault"
    }
    obs.logs, obs.facts["store_killed"]["new_leader"] = rounds0, "m1"  # the killed member still leads: no kill
    assert not judge(obs, sc.expect, sc.checks).passed

    obs = no_fault_observation("store-outage")
    obs.facts["store_outage"] = (CFG.kill_step + 0.5, CFG.kill_step + 4.5)
    obs.logs = rounds0 + [(7.0, "[rendezvous] membership store unreachable: keep-alives paused, training goes on")]
    sc = scenarios(CFG)["store-outage"]
    assert judge(obs, sc.expect, sc.checks).passed
    obs.logs = rounds0  # nobody said the store was away: it was not
    assert {c.name for c in judge(obs, sc.expect, sc.checks).failed()} == {"training went on with the store down"}


def straggler_run(slow_s: float = 3.0) -> list[dict]:
    """Slowed from t 6.5 (after step 6), named at step 9, its node out, restarted from step 9 on the spare at t 20."""
    slowed = [dict(step(6.5 + 3 * (n - 6), n), step_time_s=slow_s) for n in (7, 8, 9)]
    named = {
        "event": "straggler",
        "time": 15.6,
        "step": 9,
        "rank": 1,
        "node": 1,
        "host": "h",
        "work_s": 0.6,
        "median_s": 0.2,
        "ratio": 3.0,
        "slow_steps": 3,
        "action": "taking its node out after the in-memory snapshot of step 9: a hot spare takes its place",
    }
    return (
        [start(0)]
        + [step(n, n) for n in range(1, 7)]
        + slowed
        + [named]
        + [dict(start(19, 9, restart=1), restored_from={"tier": "peer", "step": 9})]
        + [step(20 + n - 10, n) for n in range(10, CFG.steps + 1)]
        + [{"event": "end", "time": 40, "step": 16}]
    )


def test_straggler_verdict_needs_the_named_rank_its_node_leaving_and_the_slowed_steps():
    from chaos.local.scenarios import check_back_to_speed, check_spare_replaced_straggler, check_straggler_named

    obs = no_fault_observation("straggler")
    obs.records, obs.facts = straggler_run(), {**obs.facts, "spare_ranks_after": [1], "slow_until": 19.5}
    obs.logs = [(16.0, "[agent] this node left the job: rank 1 (node 1, host h) is a straggler")]
    assert check_straggler_named(obs).ok and check_spare_replaced_straggler(obs).ok
    back = check_back_to_speed(obs)
    assert back.ok and "back within 1.5x of normal 13.5 s after the slowdown began" in back.detail, back.detail
    obs.facts["slow_ranks"] = [0]  # the event names a rank of another node
    assert not check_straggler_named(obs).ok
    obs.facts["slow_ranks"] = [1]
    obs.logs = []  # the slow node never said it left (the job re-formed for another reason)
    assert not check_spare_replaced_straggler(obs).ok
    obs.records = straggler_run(slow_s=1.1)  # the job's steps hardly slowed: the fault took no effect
    assert not check_back_to_speed(obs).ok

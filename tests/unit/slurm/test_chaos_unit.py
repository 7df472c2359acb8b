"""Slurm chaos harness without a cluster: settings, log tailing, and its verdicts on hand-made observations."""

from __future__ import annotations

import pytest

from chaos.slurm import SlurmChaosConfig, Tail, scenarios
from chaos.verdict import Fault, Observation, judge

CFG = SlurmChaosConfig()


def rec(event, t, **kw):
    return {"event": event, "time": float(t), **kw}


def step(t, n):
    return rec("step", t, step=n, loss=10.0 - n, world_size=2, step_time_s=1.0, data_offset=(n - 1) * 8)


SPARE_TOOK_OVER = {"killed_node": "n3", "killed_ranks": [1], "batch_host": "n1", "final_nodes": ["n1", "n2"]}


def observation(records, faults, requeues, restarts, detections=(), **facts):
    starts = sum(1 for r in records if r["event"] == "start" and faults and r["time"] > faults[0].time)
    return Observation(
        records=records,
        faults=faults,
        detections=list(detections),
        exited_ok=True,
        exit_detail="COMPLETED 0:0",
        steps=CFG.steps,
        global_batch=8,
        final_committed=True,
        weight_diffs=[],
        reference_records=[],
        wall_s=30.0,
        facts={
            "requeues": requeues,
            "torchrun restarts": restarts,
            "final_state": "COMPLETED",
            "starts after the fault": starts,
            **facts,
        },
    )


def uninterrupted():
    recs = [rec("start", 0, restart_count=0, resumed_from=None)] + [step(n, n) for n in range(1, CFG.steps + 1)]
    recs += [rec("checkpoint", n + 0.5, step=n) for n in range(2, CFG.steps + 1, 2)]
    return sorted(recs, key=lambda r: r["time"]) + [rec("end", CFG.steps + 1, step=CFG.steps)]


def node_kill_run(resumed: int = 4):
    """Killed after step 5 (t=5.5); checkpoint 4 committed; requeued, resumed from ``resumed`` at t=20."""
    recs = [rec("start", 0, restart_count=0, resumed_from=None)] + [step(n, n) for n in range(1, 6)]
    recs += [rec("checkpoint", 2.5, step=2), rec("checkpoint", 4.6, step=4)]
    recs += [rec("start", 20, restart_count=0, resumed_from=resumed)]
    recs += [step(20 + n, n) for n in range(resumed + 1, CFG.steps + 1)]
    return sorted(recs, key=lambda r: r["time"]) + [rec("end", 40, step=CFG.steps)]


def test_node_kill_verdict_passes_when_the_spare_takes_over_inside_the_allocation():
    sc = scenarios(CFG)["node-kill"]
    fault = [Fault("kill node n3", 5.5, True, "no process left")]
    v = judge(observation(node_kill_run(), fault, 0, 0, [7.0], **SPARE_TOOK_OVER), sc.expect, sc.checks)
    assert v.passed, v.failed()
    (r,) = v.recoveries
    assert (r.steps_lost, r.detect_s, r.recover_s) == (1, 1.5, 19.5)
    # a requeue (the allocation was lost) fails it, and so does a world without the spare or with the lost node
    failed = {
        c.name
        for c in judge(
            observation(node_kill_run(), fault, 1, 0, [7.0], **SPARE_TOOK_OVER), sc.expect, sc.checks
        ).failed()
    }
    assert failed == {"continued inside the allocation, no requeue"}
    for final in (["n2", "n3"], ["n2"]):
        failed = {
            c.name
            for c in judge(
                observation(node_kill_run(), fault, 0, 0, [7.0], **{**SPARE_TOOK_OVER, "final_nodes": final}),
                sc.expect,
                sc.checks,
            ).failed()
        }
        assert failed == {"the spare took the lost node's place"}, final


def test_first_node_kill_must_hit_rank_0_off_the_batch_host():
    sc = scenarios(CFG)["first-node-kill"]
    fault = [Fault("kill node n2", 5.5, True, "no process left")]
    facts = {**SPARE_TOOK_OVER, "killed_node": "n2", "killed_ranks": [0], "final_nodes": ["n1", "n3"]}
    assert judge(observation(node_kill_run(), fault, 0, 0, [7.0], **facts), sc.expect, sc.checks).passed
    for bad in ({"killed_ranks": [1]}, {"killed_node": "n1", "final_nodes": ["n2", "n3"]}):
        failed = {
            c.name
            for c in judge(
                observation(node_kill_run(), fault, 0, 0, [7.0], **{**facts, **bad}), sc.expect, sc.checks
            ).failed()
        }
        assert "the killed node ran rank 0, not the batch script" in failed, bad


def test_batch_host_kill_leaves_training_alone_and_needs_the_requeue():
    """The batch host is the standby spare: training goes on; a surviving node requeues the job, whose rerun
    finds it finished. An attempt that had to start over, or no requeue, fails it."""
    sc = scenarios(CFG)["batch-host-kill"]
    fault = [Fault("kill node n1", 5.5, True, "no process left")]
    rerun = uninterrupted()[:-1] + [
        rec("end", CFG.steps + 1, step=CFG.steps, status="finished"),
        rec("start", 30, restart_count=0, resumed_from=CFG.steps),
        rec("end", 31, step=CFG.steps, status="already_finished"),
    ]
    v = judge(observation(rerun, fault, 1, 0, [12.0]), sc.expect, sc.checks)
    assert v.passed, v.failed()
    failed = {c.name for c in judge(observation(rerun, fault, 0, 0, [12.0]), sc.expect, sc.checks).failed()}
    assert failed == {"Slurm requeued the job"}
    failed = {c.name for c in judge(observation(node_kill_run(), fault, 1, 0, [12.0]), sc.expect, sc.checks).failed()}
    assert "training went on untouched" in failed


@pytest.mark.parametrize(
    "name",
    [
        "node-kill",
        "first-node-kill",
        "network-cut",
        "worker-kill",
        "worker-kill-in-place",
        "node-kill-in-place",
        "first-node-kill-in-place",
        "preemption",
        "batch-host-kill",
        "store-member-kill",
        "store-outage",
        "store-outage-then-worker-kill",
        "straggler",
        "straggler-in-place",
        "wedged-rank",
    ],
)
def test_slurm_verdict_fails_without_its_fault(name):
    """An uninterrupted job, the fault claimed and confirmed, Slurm figures as a real fault would leave them."""
    sc = scenarios(CFG)[name]
    v = judge(
        observation(
            uninterrupted(),
            [Fault(name, 5.5, True, "claimed")],
            requeues=1,
            restarts=1,
            **{**SPARE_TOOK_OVER, "killed_ranks": [0]},
        ),
        sc.expect,
        sc.checks,
    )
    failed = {c.name for c in v.failed()}
    assert not v.passed and "fault injected" not in failed
    untouched = {"batch-host-kill", "store-member-kill", "store-outage"}  # no restart expected: noticed is the proof
    lost = "the lost node's ranks taken by the spare's workers, the survivors kept or replaced alone, no restart"
    cut = "the survivors' blocked collective cut in their processes, every survivor's pid kept"
    in_place = {
        "worker-kill-in-place": {"failure noticed", "survivors kept their processes, one worker replaced"},
        "node-kill-in-place": {"failure noticed", lost, cut},
        "first-node-kill-in-place": {
            "failure noticed",
            lost,
            cut,
            "rank 0 taken by the spare's worker, the survivors' shards kept where they were",
        },
        "straggler-in-place": {
            "failure noticed",
            "the straggler's node left, the survivors recovered in place for it",
            "survivors kept their processes, the lost node's ranks taken by the spare's workers",
        },
    }
    want = {"failure noticed"} if name in untouched else {"job restarted", "failure noticed"}
    assert in_place.get(name, want) <= failed


def straggler_run(slow_s: float = 3.0):
    """n3 (rank 1) slowed after step 3 (t 3.5), named at step 6 and taken out after its snapshot; the group restarts
    on n1 (the spare) and n2 at t 16 from step 6's in-memory snapshot, at normal speed."""
    recs = [rec("start", 0, restart_count=0, resumed_from=None)] + [step(n, n) for n in range(1, 4)]
    recs += [dict(step(3.5 + 3 * (n - 3), n), step_time_s=slow_s) for n in (4, 5, 6)]
    recs += [rec("checkpoint", 2.5, step=2), rec("checkpoint", 10.0, step=4)]
    recs += [
        rec(
            "straggler",
            12.6,
            step=6,
            rank=1,
            node=1,
            host="n3",
            work_s=0.09,
            median_s=0.03,
            ratio=3.0,
            slow_steps=3,
            action="taking its node out after the in-memory snapshot of step 6: a hot spare takes its place",
        ),
        rec("start", 16, restart_count=0, resumed_from=6, restored_from={"tier": "memory", "step": 6}),
    ]
    recs += [step(16 + n - 6, n) for n in range(7, CFG.steps + 1)]
    return sorted(recs, key=lambda r: r["time"]) + [rec("end", 40, step=CFG.steps)]


STRAGGLER_FACTS = {"slow_node": "n3", "slow_ranks": [1], "spare": "n1", "final_nodes": ["n1", "n2"], "slow_until": 16}
LEFT = (
    13.0,
    "n3: [agent] this node left the job: rank 1 (node 1, host n3) is a straggler; a hot spare takes its place",
)


def test_straggler_verdict_needs_the_slow_node_named_replaced_by_the_spare_in_the_allocation():
    sc = scenarios(CFG)["straggler"]
    fault = [Fault("slow n3 to 25% CPU", 3.5, True, "workers in the node's cgroup, throttled")]
    obs = observation(straggler_run(), fault, 0, 0, [12.6], **STRAGGLER_FACTS)
    obs.logs = [LEFT]
    v = judge(obs, sc.expect, sc.checks)
    assert v.passed, v.failed()
    assert v.recoveries[0].steps_lost == 0
    back = next(c for c in v.checks if c.name == "steps slowed by the fault, faster again after the take-over")
    assert "back within 1.5x of normal 13.5 s after the slowdown began" in back.detail, back.detail

    def failed(records=None, requeues=0, logs=(LEFT,), **facts):
        o = observation(records or straggler_run(), fault, requeues, 0, [12.6], **{**STRAGGLER_FACTS, **facts})
        o.logs = list(logs)
        return {c.name for c in judge(o, sc.expect, sc.checks).failed()}

    assert "continued inside the allocation, no requeue" in failed(requeues=1)
    assert failed(final_nodes=["n2", "n3"]) == {"the slow node left, the spare took its place"}
    assert failed(logs=()) == {"the slow node left, the spare took its place"}  # re-formed for another reason
    assert failed(slow_ranks=[0]) == {"straggler named on the slow node"}  # another node's rank was named
    # the steps hardly slowed: the fault took no effect
    assert "steps slowed by the fault, faster again after the take-over" in failed(straggler_run(slow_s=1.1))


def test_back_to_speed_counts_from_the_last_stretched_step_not_the_steps_before_the_slowdown_bit():
    """A quota takes a step or two to show: the fast steps right after the fault are not the recovery."""
    from chaos.grey import back_to_speed_s

    recs = [dict(r, step_time_s=1.0) if r["event"] == "step" and r["step"] in (4, 5) else r for r in straggler_run()]
    obs = observation(recs, [Fault("slow n3", 3.5, True, "x")], 0, 0, **STRAGGLER_FACTS)
    assert back_to_speed_s(obs) == (13.5, 1.0)  # step 7 (t 17) and 8 after the slow step 6, not steps 4 and 5
    obs.facts["slow_until"] = None  # unknown: counted from the fault, as before
    assert back_to_speed_s(obs) == (3.0, 1.0)


def test_wedged_rank_verdict_needs_its_own_wedge_line_its_agent_kill_and_no_requeue():
    sc = scenarios(CFG)["wedged-rank"]
    t = 5.5
    fault = [Fault("wedged main thread of rank 1 on n3", t, True, "alive, not stopped")]
    wedge = {"wedge": {"step": 6, "rank": 1, "pid": 77, "time": t}}
    recs = [
        dict(r, restored_from={"tier": "memory", "step": 5}) if r["event"] == "start" and r["time"] > t else r
        for r in node_kill_run(resumed=5)
    ]  # step 6 never finished: resumed from step 5's in-memory snapshot
    lines = [
        (
            t + 3.2,
            "n3: [watchdog] rank 1 (node 1, pid 77) is wedged: no progress in phase forward_backward of "
            "step 6 for 3.1 s (bound 3.0 s)",
        ),
        (t + 3.4, "n3: [agent] worker pid 77 (rank 1) declared itself wedged (its line above): SIGKILLed it"),
    ]

    def verdict(requeues=0, logs=tuple(lines), **facts):
        o = observation(recs, fault, requeues, 1, [], **{**wedge, **facts})
        o.logs, o.detections = list(logs), [at for at, _ in logs]
        return judge(o, sc.expect, sc.checks)

    v = verdict()
    assert v.passed, v.failed()
    assert {c.name for c in verdict(requeues=1).failed()} == {"torchrun restarted the workers, no requeue"}
    assert "wedged rank declared and killed by its agent" in {c.name for c in verdict(logs=lines[1:]).failed()}
    assert "wedged rank declared and killed by its agent" in {c.name for c in verdict(logs=lines[:1]).failed()}


def test_worker_kill_must_not_requeue():
    sc = scenarios(CFG)["worker-kill"]
    recs = node_kill_run()
    fault = [Fault("kill workers on n2", 5.5, True, "workers gone")]
    assert judge(observation(recs, fault, requeues=0, restarts=1, detections=[5.6]), sc.expect, sc.checks).passed
    failed = {c.name for c in judge(observation(recs, fault, 1, 0, [5.6]), sc.expect, sc.checks).failed()}
    assert failed == {"torchrun restarted the workers, no requeue"}


def test_resume_from_an_older_checkpoint_fails():
    sc = scenarios(CFG)["node-kill"]
    recs = node_kill_run(resumed=2)  # checkpoint 4 was committed before the restart
    failed = {
        c.name: c.detail
        for c in judge(
            observation(recs, [Fault("kill", 5.5, True, "x")], 0, 0, [7.0], **SPARE_TOOK_OVER), sc.expect, sc.checks
        ).failed()
    }
    assert "resumed from step 2" in failed["resumed from the newest complete checkpoint"]


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"scenarios": "node-kill,hang"}, "hang (not on slurm)"),
        ({"scenarios": "bogus"}, "unknown scenario"),
        ({"nodes": 1}, "at least 2 nodes"),
        ({"fault_step": 2, "interval": 2}, "interval (2) < fault step (2)"),
        ({"fault_step": 12, "steps": 12}, "< steps"),
        ({"spares": 0}, "only with a hot spare"),
        ({"spares": 0, "scenarios": "worker-kill,preemption,bogus"}, "bogus"),
        ({"spares": 9}, "--spares 9"),
        ({"slow_percent": 0}, "--slow-percent 0: use 1..90"),
        ({"slow_percent": 100}, "--slow-percent 100"),
    ],
)
def test_bad_chaos_settings(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        SlurmChaosConfig(**kw).validate()


def test_default_runs_every_slurm_scenario():
    assert SlurmChaosConfig().names == [
        "node-kill",
        "first-node-kill",
        "network-cut",
        "worker-kill",
        "worker-kill-in-place",
        "node-kill-in-place",
        "first-node-kill-in-place",
        "preemption",
        "batch-host-kill",
        "store-member-kill",
        "store-outage",
        "store-outage-then-worker-kill",
        "straggler",
        "straggler-in-place",
        "wedged-rank",
        "split-brain",
    ]
    SlurmChaosConfig(spares=0, scenarios="worker-kill,preemption,batch-host-kill").validate()  # no spare needed


def test_the_straggler_is_held_to_a_third_of_a_cpu_unless_told_otherwise():
    from chaos.slurm import build_parser, scenarios

    assert build_parser().parse_args([]).slow_percent == SlurmChaosConfig().slow_percent == 33  # the third
    for percent in (33, 10):
        sc = scenarios(SlurmChaosConfig(slow_percent=percent))["straggler"]
        assert sc.inject.keywords == {"percent": percent} and f"to {percent}% of one CPU" in sc.title


def test_tail_returns_only_complete_lines(tmp_path):
    f = tmp_path / "m.jsonl"
    t = Tail(f)
    assert t.read() == []
    f.write_text('{"event": "start", "time": 1}\n{"event": "st')
    assert [line for _, line in t.read()] == ['{"event": "start", "time": 1}']
    with open(f, "a") as fh:
        fh.write('ep", "time": 2, "step": 1}\n')
    assert [line for _, line in t.read()] == ['{"event": "step", "time": 2, "step": 1}']


def test_log_lines_that_count_as_noticed():
    noticed = {name: sc.noticed for name, sc in scenarios(CFG).items()}
    logs = [
        (1.0, "[job] step 5"),
        (2.0, "[job] received SIGUSR1: checkpoint and requeue"),
        (3.0, "E failed (exitcode: -9) local_rank: 0"),
    ]
    assert noticed["preemption"](logs) == [2.0]
    assert noticed["worker-kill"](logs) == [3.0]
    assert noticed["node-kill"](logs) == [3.0]
    assert noticed["network-cut"](logs + [(4.0, "[watchdog] node 1 silent")]) == [3.0, 4.0]
    assert noticed["batch-host-kill"](logs) == []
    # the etcd rendezvous names a lost node itself; the c10d agent's line still counts
    etcd = [(5.0, "1: [rendezvous] lost node(s) of round 0: n3-77-ab12 (membership lease expired, TTL 3 s): ...")]
    c10d = [(6.0, "0: [agent] lost node(s) of this round: n3")]
    assert noticed["node-kill"](etcd + c10d) == [5.0, 6.0]
    assert noticed["worker-kill"](etcd) == [5.0]
    outage = [
        (7.0, "0: [rendezvous] membership store unreachable: keep-alives paused, training goes on"),
        (8.0, "1: [rendezvous] a new round waits for the membership store (no member answered)"),
    ]
    assert noticed["store-outage"](logs + outage) == [7.0, 8.0]


def test_resume_from_a_newer_in_memory_snapshot_passes_only_when_the_start_says_so():
    """After a network cut the job restored step 5 from the memory tier, newer than checkpoint 4: that is the
    newest state, if (and only if) the start event says it came from memory at that step."""
    from chaos.slurm import check_resumed_newest

    recs = node_kill_run(resumed=5)
    obs = observation(recs, [Fault("cut link of n3", 5.5, True, "link DOWN")], 0, 0, [6.3], **SPARE_TOOK_OVER)
    assert not check_resumed_newest(obs).ok  # step 5 was never committed to storage, and nothing says memory
    for r in obs.records:
        if r.get("event") == "start" and r.get("resumed_from") == 5:
            r["restored_from"] = {"tier": "memory", "step": 5}
    assert check_resumed_newest(obs).ok
    assert judge(obs, scenarios(CFG)["network-cut"].expect, scenarios(CFG)["network-cut"].checks).passed


# ------------------------------------------------------------------------------------------- the etcd store
def test_store_member_kill_passes_only_untouched():
    """The leader SIGKILLed at 5.5, a new one elected at 6.6: the job trains on, no restart, no requeue, no node
    lost. An attempt started over, a requeue or a node declared lost each fail it."""
    sc = scenarios(CFG)["store-member-kill"]
    fault = [Fault("SIGKILL etcd leader m0", 5.5, True, "m0 gone, m1 elected")]
    v = judge(observation(uninterrupted(), fault, 0, 0, [6.6]), sc.expect, sc.checks)
    assert v.passed, v.failed()
    assert v.recoveries[0].detect_s == pytest.approx(1.1)
    assert {c.name for c in judge(observation(node_kill_run(), fault, 0, 1, [6.6]), sc.expect, sc.checks).failed()} == {
        "training went on untouched"
    }
    assert {c.name for c in judge(observation(uninterrupted(), fault, 1, 0, [6.6]), sc.expect, sc.checks).failed()} == {
        "no requeue"
    }
    obs = observation(uninterrupted(), fault, 0, 0, [6.6])
    obs.logs = [(7.0, "0: [rendezvous] lost node(s) of round 0: n3-1-abc (membership lease expired, TTL 3 s)")]
    assert {c.name for c in judge(obs, sc.expect, sc.checks).failed()} == {"no node declared lost"}


def outage_logs():
    return [
        (5.9, "0: [rendezvous] membership store unreachable: keep-alives paused, training goes on"),
        (25.3, "1: [rendezvous] membership store answers again: keep-alives resumed"),
    ]


def test_store_outage_needs_steps_during_the_outage():
    """Every member stopped at 5.5, started at 25.0 and answering at 25.5: steps 6..12 were logged meanwhile, an
    agent said it reconnected. A job that stalled until the store came back (its steps all after 25.5) fails, so
    does a store that never came back, and agents that never said they reconnected."""
    sc = scenarios(CFG)["store-outage"]
    fault = [Fault("stop every etcd member", 5.5, True, "no member running")]

    def run(records, logs=None, **facts):
        logs = outage_logs() if logs is None else logs
        obs = observation(
            records, fault, 0, 0, **{"store_stopped": 5.5, "store_started": 25.0, "store_back": 25.5, **facts}
        )
        obs.detections = sc.noticed(logs)
        obs.logs = logs
        return judge(obs, sc.expect, sc.checks)

    v = run(uninterrupted())
    assert v.passed, v.failed()
    stalled = [r if r["time"] < 5.5 else {**r, "time": r["time"] + 20} for r in uninterrupted()]
    assert {c.name for c in run(stalled).failed()} == {"trained while no member answered"}
    assert "trained while no member answered" in {c.name for c in run(uninterrupted(), store_back=None).failed()}
    assert {c.name for c in run(uninterrupted(), outage_logs()[:1]).failed()} == {"the agents reconnected"}


def test_store_outage_then_worker_kill_trains_again_within_5_s_of_the_store():
    """Workers killed at 5.5 with every member down; the store is back at 20.5, the new group's first step at 25.
    4.5 s: passes; the store back at 19.5 (5.5 s before that step): fails; a requeue instead: fails."""
    sc = scenarios(CFG)["store-outage-then-worker-kill"]
    fault = [Fault("stop every etcd member, then kill workers on n3", 5.5, True, "no member; workers gone")]
    check = f"trained again <= {5:g} s after the store is back"

    def run(back, requeues=0):
        return judge(
            observation(node_kill_run(), fault, requeues, 1, [5.6], store_stopped=5.4, store_back=back),
            sc.expect,
            sc.checks,
        )

    v = run(20.5)
    assert v.passed, v.failed()
    assert {c.name for c in run(19.5).failed()} == {check}
    assert "torchrun restarted the workers, no requeue" in {c.name for c in run(20.5, requeues=1).failed()}

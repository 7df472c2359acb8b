"""End to end: real torchrun agents on loopback, a standalone rendezvous store, real SIGKILL/SIGTERM.

Scenarios of the local chaos harness (worker-kill, node-loss-rejoin, node-kill-with-spare, straggler, preemption,
kill-during-save) on a lean job (debug preset, 1 proc per node, 10 steps, dropout off so that they all share one
reference run, cached under .chaos/cache), and every local verdict judged on that real uninterrupted run, where it
must fail.
Timings are recorded in the report, never asserted: the CI machine is shared.
"""

from dataclasses import replace
from pathlib import Path

import pytest

from chaos import catalog
from chaos.local.config import REPO, LocalChaosConfig
from chaos.local.log_digest import digest
from chaos.local.scenarios import base_facts, reference, run_scenario, scenarios
from chaos.verdict import Fault, Observation, compare_weights, judge
from training.checkpoint import MARKER

pytestmark = pytest.mark.e2e

# slow_commit_s: kill-during-save's "written, not committed" window, which the harness polls every 0.05 s; every
# commit of that job waits it out (5 s cost ~15 s more), and the reference does not depend on it.
CFG = LocalChaosConfig(
    steps=10, interval=3, slow_commit_s=2.0, extra_args=("--model.dropout", "0"), scenario_timeout_s=240
)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(CFG, REPO / ".chaos" / "cache", tmp_path_factory.mktemp("chaos-ref"))


def run(name: str, ref, tmp_path: Path, *flags: str):
    sc = scenarios(CFG)[name]
    sc = replace(sc, flags=sc.flags + flags)  # fault hooks only: the shared reference still applies
    # node-loss-rejoin's own dropout-off reference is the shared one here: its math flags are in extra_args
    res = run_scenario(CFG, sc, ref, tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in res.checks if not c.ok]
    assert res.passed, f"scenario {name} failed ({res.workdir}/logs): {failed}\n{digest(res.workdir)}"
    names = {c.name for c in res.checks}
    assert {"fault injected", "failure noticed", "job restarted"} <= names
    # a passing scenario keeps its logs and metrics, not its bulk (checkpoints, snapshots, etcd data)
    work = Path(res.workdir)
    assert all((work / p).exists() for p in ("logs", "job/metrics.jsonl", "etcd/etcd.log"))
    assert not [p for p in ("job/checkpoints", "node-memory", "etcd/m0") if (work / p).exists()]
    return res


def test_every_local_verdict_fails_on_a_real_run_without_its_fault(ref):
    """The uninterrupted reference run (real records, real agent logs, its own final checkpoint) judged as
    each scenario, the fault claimed and confirmed by the harness: every verdict fails on the job's evidence."""
    t = next(r["time"] for r in ref.records if r.get("event") == "step" and r["step"] == CFG.kill_step)
    facts = {
        **base_facts(CFG),
        "rank0_node": 0,
        "killed_node": 0,
        "store_alive_at_end": True,
        "max_restarts": 1,
        "partial_checkpoint": f"step_{2 * CFG.interval:08d}",
        "corrupt_checkpoint": f"step_{2 * CFG.interval:08d}",
        "truncated": {"file": "x.distcp", "from": 2, "to": 1},
        "silent_ranks": [1],
        "spare_nodes": [2],
        "spare_ranks_after": [],
    }
    # the reference against itself: the same (empty) differences for every scenario, so loaded and compared once
    # (21 times was 23 s of this test)
    weight_diffs = compare_weights(ref.final, ref.final)
    for name in catalog.PLATFORMS["local"]:
        sc = scenarios(CFG)[name]
        obs = Observation(
            records=ref.records,
            faults=[Fault(name, t, True, "claimed, never done")],
            rejoins=[t + 1] if name in ("node-loss-rejoin", "silent-node") else [],
            exited_ok=True,
            exit_detail="exit codes 0",
            steps=CFG.steps,
            global_batch=CFG.global_batch,
            final_committed=(ref.final / MARKER).exists(),
            weight_diffs=weight_diffs,
            reference_records=ref.records,
            wall_s=ref.wall_s,
            logs=ref.logs,
            checkpoint_dir=ref.final.parent,
            facts=facts,
        )
        v = judge(obs, sc.expect, sc.checks)
        assert not v.passed, f"{name} passed on an uninterrupted run: {v.checks}"
        assert {c.name for c in v.failed()} - {"fault injected"}, name


def test_worker_kill_resumes_bitwise(ref, tmp_path):
    res = run("worker-kill", ref, tmp_path)
    rec = res.recoveries[0]
    assert rec.kind == "SIGKILL worker" and rec.restarts >= 1
    # killed mid-interval: the in-memory snapshot of the last (or the one before) step is restored, not the
    # checkpoint 3 steps back
    assert rec.tier == "memory" and rec.steps_lost <= CFG.memory_interval
    assert res.world_sizes == [CFG.world]


def test_node_loss_shrinks_then_rejoins(ref, tmp_path):
    # The harness holds the job after its second step at world 1 until the rejoined node trains (--fault.hold_file):
    # 1 s per step (on top of the ~0.6 s a step takes) only gives the harness time to see the first two steps at
    # world 1 before a 10-step job ends: it polls every 0.1 s and has about two steps to spare. (2 s per step gave
    # the same run, 10 s longer.)
    res = run("node-loss-rejoin", ref, tmp_path, "--fault.step_sleep_s", "1")
    assert res.world_sizes[0] == CFG.world and CFG.world - 1 in res.world_sizes and res.world_sizes[-1] == CFG.world
    kinds = [r.kind for r in res.recoveries]
    assert kinds == ["SIGKILL node", "rejoin"]
    # the survivor held its own shard and the lost node's replica: re-cut from memory, not storage
    lost = res.recoveries[0]
    assert lost.tier == "peer" and lost.steps_lost <= CFG.memory_interval, lost
    assert all(r.recover_s is not None for r in res.recoveries)
    names = {c.name for c in res.checks}
    assert "every sample exactly once" in names and f"weights within {CFG.atol:g} of reference" in names


def test_hot_spare_replaces_a_killed_node_at_the_same_world_size(ref, tmp_path):
    """A fixed-size 2-node job with a third agent waiting: a training node is SIGKILLed and no replacement is
    started; the spare takes its place (its memory is empty: the lost ranks come from their peer replica) and
    the final weights equal the uninterrupted run's bitwise."""
    res = run("node-kill-with-spare", ref, tmp_path)
    assert res.world_sizes == [CFG.world]
    rec = res.recoveries[0]
    assert rec.kind == "SIGKILL node" and rec.tier == "peer" and rec.steps_lost <= CFG.memory_interval
    spare = next(c for c in res.checks if c.name == "hot spare took the lost node's place")
    assert spare.ok, spare.detail


def test_in_place_a_spares_workers_join_the_survivors_of_a_killed_node(ref, tmp_path):
    """The same loss in a ``failover.in_place`` job: the round that replaces the node keeps the survivor's worker
    running, the spare's worker joins its epoch in the lost rank (its shard from the peer replica); one attempt, the
    survivor's pid kept, the final weights bitwise equal to the uninterrupted run's; the node was taken out by the
    survivor's agent (its agent dead), not by its lease's expiry. Without the in-place path the
    same fault restarts every worker (the test above), which this scenario's verdict fails
    (tests/unit/failover/test_inplace_node_verdict.py)."""
    sc = scenarios(CFG)["node-kill-in-place"]
    res = run_scenario(CFG, sc, ref, tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in res.checks if not c.ok]
    assert res.passed, f"{failed}\n{digest(res.workdir)}"
    kept = next(c for c in res.checks if c.name.startswith("survivors kept their processes, the lost node's"))
    assert kept.ok and "1 in-place recovery(ies), 1 attempt(s)" in kept.detail, kept.detail
    assert res.world_sizes == [CFG.world]
    recomputed = next(c.detail for c in res.checks if c.name.startswith("steps recomputed in place"))
    # the killed node's agent is dead (its store refuses connections): a survivor's agent took it out at once, not
    # after its lease's TTL (training.launch.rendezvous.dead_agent)
    assert "the lost node taken out by a peer" in recomputed, f"{recomputed}\n{digest(res.workdir)}"
    print(recomputed)


def test_a_straggler_is_named_and_replaced_by_the_spare_after_a_snapshot(ref, tmp_path):
    """A training node stopped 0.2 s of every 0.3 s from step 3 on, a spare waiting: the slow rank is named from the
    ranks' work times, its node leaves after a step's in-memory snapshot, the spare takes its place: nothing
    recomputed, bitwise equal. M = 2 slow steps (default 3) so that a 10-step job has room after it. Skips (saying
    so) when it failed and the machine's cores were so oversubscribed that the fault slowed the job less than 2.5x
    (quiet here: normal steps 0.63 s, slowed 2.3 s, x3.5, named at step 7; a clean clone's suite on 3 workers:
    normal 1.56 s, slowed 3.37 s, x2.16, named only at the last step, step 10, with no step left for the spare)."""
    res = straggler_run("straggler", ref, tmp_path)
    assert res.world_sizes == [CFG.world]
    rec = res.recoveries[0]
    # the straggler's shard from its peer's replica, or the storage checkpoint when the take-out step has one
    assert rec.steps_lost == 0 and rec.tier in ("peer", "storage"), rec
    named = next(c for c in res.checks if c.name == "straggler named on the slow node")
    assert "taking its node out" in named.detail, named.detail


def test_in_place_only_the_stragglers_workers_stop_and_the_spares_join_the_survivors(ref, tmp_path):
    """The same slow node in a ``failover.in_place`` job: its workers stop after the step's snapshot, its agent
    leaves, the round that replaces it keeps the survivor's worker running (its pid kept, one attempt) and the
    spare's worker joins its epoch in the straggler's rank: nothing recomputed, bitwise equal. Skips as the test
    above does on an oversubscribed machine."""
    res = straggler_run("straggler-in-place", ref, tmp_path)
    kept = next(c for c in res.checks if c.name.startswith("survivors kept their processes, the lost node's"))
    assert "1 in-place recovery(ies), 1 attempt(s)" in kept.detail, kept.detail
    assert res.world_sizes == [CFG.world] and res.recoveries[0].steps_lost == 0, res.recoveries


def straggler_run(name: str, ref, tmp_path):
    """Run straggler scenario ``name`` with M = 2 slow steps; skip, saying so, when it failed because the machine's
    cores were too oversubscribed for the fault to slow the job 2.5x."""
    from chaos.local.scenarios import slowdown

    sc = scenarios(CFG)[name]
    res = run_scenario(CFG, replace(sc, flags=sc.flags + ("--straggler.steps", "2")), ref, tmp_path)
    fault = next(e["time"] for e in res.events if e["kind"] == "fault")
    spare_trained = [e["time"] for e in res.events if e["kind"] == "observed"]
    normal, slow, ratio = slowdown(res.timeline, fault, spare_trained[0] if spare_trained else float("inf"))
    if not res.passed and ratio < 2.5:
        # The cores are oversubscribed (other jobs on the 2 shared cores): stopping one process 2/3 of the time then
        # frees the core its peer uses meanwhile, the job slows < 2.5x and the slow rank is told from noise too late
        # (measured: 0.9-2.5x its peer's work under 2 extra busy loops). The fault did not happen as specified.
        pytest.skip(
            f"the slow node slowed the job only x{ratio:.2f} (step {normal:.2f} s -> {slow:.2f} s): this "
            f"machine's cores are oversubscribed, a node stopped 2/3 of the time is not a third as fast here"
        )
    failed = [f"{c.name}: {c.detail}" for c in res.checks if not c.ok]
    assert res.passed, f"scenario {name} failed ({res.workdir}/logs): {failed}\n{digest(res.workdir)}"
    return res


def test_preemption_checkpoints_on_signal_and_loses_nothing(ref, tmp_path):
    res = run("preemption", ref, tmp_path)
    assert [r.steps_lost for r in res.recoveries] == [0]
    assert any(e["kind"] == "relaunch" for e in res.events)


def test_partial_async_checkpoint_is_ignored(ref, tmp_path):
    res = run("kill-during-save", ref, tmp_path)
    check = next(c for c in res.checks if c.name == "partial checkpoint ignored")
    assert f"resumed from step {CFG.interval}" in check.detail


def test_launcher_local_mode_runs_two_nodes_against_its_own_store(tmp_path):
    """`python -m training.launch --nodes 2`: 3 etcd members + 2 agents + a finished job, members stopped after."""
    import subprocess
    import sys

    from tests.conftest import TINY

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            "2",
            "--",
            *TINY,
            "--job.out_dir",
            str(tmp_path),
            "--train.steps",
            "3",
            "--checkpoint.interval",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[launch] membership: etcd members" in out.stdout and "--rdzv-backend=t5-etcd" in out.stdout
    assert "world 2" in out.stdout and (tmp_path / "checkpoints" / "step_00000003" / "COMMITTED.json").exists()


def test_a_wedged_rank_is_found_by_its_progress_and_the_job_resumes_bitwise(ref, tmp_path):
    """The last rank's main thread blocks at the start of a step while its process and heartbeat thread live on:
    its own progress verdict names it, its agent SIGKILLs it, the group resumes from the in-memory snapshot and the
    final weights equal the uninterrupted run's. The seconds to the next step are printed (target <= 10 s)."""
    res = run("wedged-rank", ref, tmp_path)
    check = next(c for c in res.checks if c.name == "wedged rank declared and killed by its agent")
    assert f"of step {CFG.kill_step} " in check.detail and "next step" in check.detail, check.detail
    rec = res.recoveries[0]
    assert rec.kind == "wedged main thread" and rec.tier == "memory" and rec.steps_lost <= CFG.memory_interval
    assert res.world_sizes == [CFG.world]
    print(f"\n[wedged-rank] {check.detail}")

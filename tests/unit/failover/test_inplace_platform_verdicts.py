"""The worker-kill-in-place verdicts of the Kubernetes contract emulator and the Slurm lab fail without their fault,
and on a group restart, and hold on the evidence of an in-place recovery."""

from __future__ import annotations

import argparse

import pytest

from chaos.kubernetes import check_no_pod_replaced
from chaos.local.scenarios import (
    check_recomputed_in_place,
    check_survivors_kept_after_node_loss,
    check_survivors_kept_in_place,
)
from chaos.slurm import SlurmChaosConfig, in_place_noticed, scenarios
from chaos.verdict import Check, Fault, Observation
from testbed.k8s_emulator import Fault as PodFault
from testbed.k8s_pod_loss import PodLoss
from testbed.k8s_worker_kill import WorkerKill

T = 1000.0
KILLED = Fault("kill rank 1 on n2", T, True, "worker pid 12 (rank 1) gone")
ONE_POD_EACH = {"node": {"0": [{"pid": 100}], "1": [{"pid": 101}]}}
#: Slurm's notes: nodes by host name; one worker on n2 killed and replaced, n1's kept
IN_PLACE = {"pid": 12, "node": "n2", "before": {"n1": [11], "n2": [12]}, "after": {"n1": [11], "n2": [13]}}
RESTARTED = {"pid": 12, "node": "n2", "before": {"n1": [11], "n2": [12]}, "after": {"n1": [21], "n2": [22]}}


def records(*, in_place: bool) -> list[dict]:
    out = [{"event": "start", "time": T - 10, "resumed_from": None, "world_size": 2}]
    out += [{"event": "step", "step": s, "time": T - 5 + s, "world_size": 2} for s in (1, 2, 3)]
    if in_place:
        out.append({"event": "in_place", "time": T + 2, "held_step": 3, "resumed_from": 2, "seconds": 1.5})
    else:
        out.append({"event": "start", "time": T + 2, "resumed_from": 2, "world_size": 2})
    out.append({"event": "step", "step": 3, "time": T + 3, "world_size": 2})
    return out


def obs(faults, recs, facts) -> Observation:
    return Observation(records=recs, faults=faults, facts={"memory_interval": 1, **facts})


def run(checks, observation: Observation) -> list[Check]:
    return [check(observation) for check in checks]


def failed(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if not c.ok}


def test_k8s_in_place_verdict_fails_without_its_fault():
    checks = [check_no_pod_replaced, check_survivors_kept_in_place, check_recomputed_in_place]
    v = run(checks, obs([], records(in_place=False), {"pods": ONE_POD_EACH}))
    assert failed(v) == {
        "no pod replaced, no JobSet restart",
        "survivors kept their processes, one worker replaced",
        "steps recomputed in place <= 1",
    }


def test_no_pod_replaced_fails_on_a_replaced_pod_or_a_jobset_restart():
    assert check_no_pod_replaced(obs([KILLED], [], {"pods": ONE_POD_EACH, "jobset_restarts": 0})).ok
    replaced = {"node": {"0": [{"pid": 100}, {"pid": 102}], "1": [{"pid": 101}]}}
    c = check_no_pod_replaced(obs([KILLED], [], {"pods": replaced, "jobset_restarts": 0}))
    assert not c.ok and "node/0" in c.detail
    assert not check_no_pod_replaced(obs([KILLED], [], {"pods": ONE_POD_EACH, "jobset_restarts": 1})).ok


def test_slurm_worker_kill_in_place_holds_on_in_place_evidence_and_fails_on_a_group_restart():
    sc = scenarios(SlurmChaosConfig())["worker-kill-in-place"]
    assert "--failover.in_place" in sc.train_args
    facts = {"requeues": 0, "final_state": "COMPLETED"}
    assert not sc.expect.restart
    kept = run(sc.checks, obs([KILLED], records(in_place=True), {**facts, "in_place_kill": IN_PLACE}))
    assert not failed(kept), kept
    restart = run(sc.checks, obs([KILLED], records(in_place=False), {**facts, "in_place_kill": RESTARTED}))
    assert failed(restart) == {"survivors kept their processes, one worker replaced", "steps recomputed in place <= 1"}
    nothing = run(sc.checks, obs([], records(in_place=False), facts))
    assert failed(nothing) == {"survivors kept their processes, one worker replaced", "steps recomputed in place <= 1"}


def test_slurm_notices_the_in_place_agents_line():
    line = "[agent] in-place: worker rank 1 (local rank 0, pid 12) died of SIGKILL: reported gone, ..."
    assert in_place_noticed([(1.0, "step 3/12"), (2.0, line)]) == [2.0]


def test_kill_worker_fault_names_a_node_pod():
    assert PodFault.parse("kill-worker:0@3") == PodFault("kill-worker", 0, 3)
    with pytest.raises(argparse.ArgumentTypeError, match="name the pod's index, e.g. kill-worker:0@3"):
        PodFault.parse("kill-worker:training@3")


def test_worker_kill_reads_only_complete_new_lines(tmp_path):
    log = tmp_path / "pod.log"
    log.write_text("before the kill\n")
    kill = WorkerKill({"time": T}, 0, 12, 1, {}, _offsets={str(log): log.stat().st_size})
    with open(log, "a") as f:
        f.write("[agent] in-place: worker rank 1 ...\npartial")
    assert kill._new_lines(str(log)) == ["[agent] in-place: worker rank 1 ..."]
    with open(log, "a") as f:
        f.write(" line\n")
    assert kill._new_lines(str(log)) == ["partial line"]


def test_in_place_workers_advertise_the_nodes_address_not_loopback():
    """A worker's in-place store server is reached by other nodes at the address the rendezvous gives this node
    (``--local-addr``, else the host's fully qualified name); loopback only reaches a peer's own host."""
    import socket

    from training.launch.agent import in_place_store_host

    assert in_place_store_host("10.0.0.7") == "10.0.0.7"
    assert in_place_store_host(None) == socket.getfqdn()


def test_a_lost_pods_in_place_evidence_passes_and_a_restart_or_no_fault_fails():
    """A node pod (index 1, pid 12) lost while pod 2 waited as a spare; pod 1's replacement waits as the next spare."""
    loss = PodLoss(index=1, time=T, pids=[12], spares=[2], before={0: [11], 1: [12], 2: []}, rank0=False)
    assert loss.in_place_scenario == "node-kill-in-place"
    assert PodLoss(0, T, [11], [2], {0: [11], 1: [12], 2: []}, rank0=True).in_place_scenario == (
        "first-node-kill-in-place"
    )
    kept = "survivors kept their processes, the lost node's ranks taken by the spare's workers"
    loss.after = {0: [11], 1: [], 2: [13]}  # the spare pod's worker took the lost ranks
    assert check_survivors_kept_after_node_loss(
        obs([KILLED], records(in_place=True), {"in_place_kill": loss.facts()})
    ).ok
    loss.after = {0: [11], 1: [13], 2: []}  # the lost pod's replacement won the join: also a pod that waited
    assert check_survivors_kept_after_node_loss(
        obs([KILLED], records(in_place=True), {"in_place_kill": loss.facts()})
    ).ok
    loss.after = {0: [21], 1: [], 2: [22]}  # every worker new: the full restart
    restarted = obs([KILLED], records(in_place=False), {"in_place_kill": loss.facts()})
    assert not check_survivors_kept_after_node_loss(restarted).ok
    assert kept in failed(run([check_survivors_kept_after_node_loss], obs([], records(in_place=False), {})))


def test_a_pod_fault_can_target_the_pod_running_rank_0():
    assert PodFault.parse("kill:rank0@3") == PodFault("kill", 0, 3, job="rank0")

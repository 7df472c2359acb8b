"""In-process recovery on the Kubernetes contract: a worker SIGKILLed inside a pod of a ``failover.in_place`` TrainJob.

The TrainJob is rendered as a user submits it (``--failover.in_place true`` among the training arguments: the
TrainJob's args; the runtime unchanged), 2 pods x 1 worker of the tiny model (the CPU shape), and run by the contract
emulator (its 3-member etcd, the project's agent as each pod's PID 1). The emulator's ``kill-worker:0@3`` SIGKILLs
the worker inside pod 0, not the pod: that pod's agent starts the worker again alone, so no pod is replaced and the
JobSet never restarts, pod 1's worker keeps its process, pod 0 holds exactly one new worker, the job completes and
its final weights equal the shared uninterrupted 2-rank run's (``tiny_reference``) bit for bit. The same kill with
``failover.in_place`` off is the agents' worker-group restart (every worker new, in both pods; still no pod
replaced), and the in-place evidence fails there.

2 pods x 2 workers (the shape of a real node: several workers a pod): on gloo a survivor whose collective peers were
all survivors can stay blocked; its agent asks it to cut its group and it keeps its process (docs/inprocess.md,
"Cutting a blocked collective"); the fall-back, the agent's kill and a replacement, the verdict counts apart on the
agent's own line. Until 2026-11-30 that shape fell back to the full restart on this
emulator (3 of 11 runs, then 3 of 3): a survivor waited, in its old checkpoint manager's close, for the storage save
in flight, whose collectives on the old group could never complete, while its peers waited for it in the new
group's first collective until their timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.local.scenarios import check_survivors_kept_in_place
from chaos.verdict import Fault, Observation
from tests.conftest import TINY, TINY_STEPS, torchrun
from tests.e2e.k8s.test_contract_e2e import emulate, passed

pytestmark = pytest.mark.e2e
KILL_AT = 3
# tiny_run's job (tests/conftest.py), so the session's tiny_reference is this job's uninterrupted run
TRAIN = (*TINY, "--train.steps", str(TINY_STEPS), "--checkpoint.interval", "3", "--checkpoint.memory_interval", "1")
IN_PLACE = ("--failover.in_place", "true")


@pytest.fixture(scope="module")
def reference(tiny_reference) -> Path:
    return tiny_reference / "checkpoints" / f"step_{TINY_STEPS:08d}"


def in_place_run(tmp_path, name: str, fault: str, scenario: str, reference: Path, capsys, cli: tuple[str, ...] = ()):
    """The in-place TrainJob (``cli``: more submit options) run by the emulator with ``fault``; it completed as
    ``scenario`` and its verdict passed. Returns (checks, report)."""
    chaos, rep, _ = emulate(tmp_path, name, fault, reference=reference, cli=cli, train_args=(*TRAIN, *IN_PLACE))
    return passed(chaos, rep, tmp_path, name, scenario, capsys), rep


def survivors_check(rep: dict):
    """The in-place evidence (every worker but the killed one kept, one new in its pod) on the report's pids."""
    (kill,) = rep["worker_kills"]
    fault = Fault("kill-worker", rep["events"][0]["time"], True, "")
    return check_survivors_kept_in_place(Observation(records=[], faults=[fault], facts={"in_place_kill": kill}))


def test_a_worker_killed_in_a_pod_is_replaced_in_place_no_pod_replaced_bitwise(tmp_path, reference, capsys):
    checks, rep = in_place_run(
        tmp_path, "t5-contract-inplace", f"kill-worker:0@{KILL_AT}", "worker-kill-in-place", reference, capsys
    )
    assert {
        "fault injected",
        "failure noticed",
        "no pod replaced, no JobSet restart",
        "survivors kept their processes, one worker replaced",
        "steps recomputed in place <= 1",
        "every sample exactly once",
        "weights bitwise == reference",
    } <= set(checks)
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 0
    assert rep["pods_created"] == {"node/0": 1, "node/1": 1}
    (kill,) = rep["worker_kills"]
    before, after = kill["before"], kill["after"]
    assert [len(before[k]) for k in sorted(before)] == [1, 1], kill
    assert kill["pid"] in before["0"] and kill["pid"] not in after["0"]
    assert set(after["1"]) == set(before["1"])  # the other pod's workers: the same processes
    assert len(set(after["0"]) - set(before["0"])) == 1 and set(before["0"]) - {kill["pid"]} <= set(after["0"])
    print(f"kill -> an agent noticed {kill['noticed_s']} s; {checks['steps recomputed in place <= 1']}")


def test_without_in_place_the_same_kill_restarts_every_worker_no_pod_replaced(tmp_path, reference, capsys):
    name = "t5-contract-inplace-off"
    chaos, rep, _ = emulate(tmp_path, name, f"kill-worker:0@{KILL_AT}", reference=reference, train_args=TRAIN)
    checks = passed(chaos, rep, tmp_path, name, "worker-kill", capsys)
    assert {"job restarted", "no pod replaced, no JobSet restart", "weights bitwise == reference"} <= set(checks)
    assert rep["pods_created"] == {"node/0": 1, "node/1": 1} and rep["jobset_restarts"] == 0
    verdict = survivors_check(rep)
    assert not verdict.ok, verdict.detail  # the in-place evidence fails on a group restart
    (kill,) = rep["worker_kills"]
    assert not set(kill["after"]["1"]) & set(kill["before"]["1"])  # the other pod's workers were restarted too


def test_rank_0s_pod_lost_with_a_spare_pod_waiting_only_that_pod_is_replaced_the_others_keep_their_workers(
    tmp_path, reference, capsys
):
    """``--spares 1``: three node pods, two train. The pod running rank 0 is SIGKILLed (its node crashed; its agent
    served the rendezvous round's store): the spare pod takes node rank 0 and the store in place, its worker joins
    the survivor's running epoch as rank 0, the survivor's worker keeps its process, rank and live state, the Job
    controller replaces the lost pod alone (it waits as the next spare), no JobSet restart, one attempt, bitwise.
    Without in place the same loss restarts every worker (the contract's ``test_with_a_hot_spare_pod_...``)."""
    checks, rep = in_place_run(
        tmp_path,
        "t5-contract-inplace-pod",
        f"kill:rank0@{KILL_AT}",
        "first-node-kill-in-place",
        reference,
        capsys,
        cli=("--spares", "1"),
    )
    assert {
        "only the failed pod was replaced",
        "survivors kept their processes, the lost node's ranks taken by the spare's workers",
        "rank 0 taken by the spare's worker, the survivors' shards kept where they were",
        "steps recomputed in place <= 1",
        "weights bitwise == reference",
    } <= set(checks)
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 1
    (loss,) = rep["pod_losses"]
    lost, survivors = set(loss["pids"]), {p for i, ps in loss["before"].items() for p in ps} - set(loss["pids"])
    assert lost and survivors and survivors <= {p for ps in loss["after"].values() for p in ps}, loss
    print(checks["steps recomputed in place <= 1"])


def test_two_workers_a_pod_a_killed_worker_is_replaced_in_place_no_pod_replaced_bitwise(tmp_path, capsys):
    """2 pods x 2 workers, rank 1 (pod 0) SIGKILLed at step 3 while the storage save of step 3 is in flight: one
    attempt, no pod replaced, every survivor kept its process (or was replaced alone by its agent as blocked, which
    it says), bitwise equal to an uninterrupted 4-rank run."""
    ref_out = tmp_path / "reference"
    ref = torchrun(4, *TRAIN, "--job.out_dir", str(ref_out))
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = ref_out / "checkpoints" / f"step_{TINY_STEPS:08d}"
    checks, rep = in_place_run(
        tmp_path,
        "t5-contract-inplace-2x2",
        f"kill-worker:0@{KILL_AT}",
        "worker-kill-in-place",
        reference,
        capsys,
        cli=("--nproc-per-node", "2"),
    )
    assert {
        "no pod replaced, no JobSet restart",
        "survivors kept their processes, one worker replaced",
        "steps recomputed in place <= 1",
        "weights bitwise == reference",
    } <= set(checks)
    (kill,) = rep["worker_kills"]
    assert [len(kill["before"][k]) for k in sorted(kill["before"])] == [2, 2], kill
    print(checks["survivors kept their processes, one worker replaced"])

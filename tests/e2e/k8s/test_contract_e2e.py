"""The shipped ClusterTrainingRuntime + TrainJob run end to end under Trainer v2.3 / JobSet semantics.

Rendered by the submit CLI exactly as `make train PLATFORM=eks DRY_RUN=1` prints them (CPU shape supplied
as user overrides), run by the contract emulator as real processes (the store job's `training.rdzv_store`,
launcher -> torchrun -> training in the node pods):

* kill node 0's pod -> the Job controller replaces that pod alone (backoffLimitPerIndex) -> node 1's agent
  re-forms the rendezvous in etcd with the new pod -> resume -> finish; no JobSet restart;
* SIGKILL the etcd member that leads (a real 3-member etcd stands in for the stack's) -> nothing restarts: no
  pod fails, no JobSet restart, one training attempt, weights bitwise equal to the reference.

The emulator judges each run with the common chaos verdict (fault confirmed, noticed, restarted, steps
recomputed, completed, every sample exactly once, final weights bitwise equal to an uninterrupted run of the
same objects) plus what the runtime promises for that fault (only the failed pod replaced / a gang restart).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY
from tests.support.k8s import render

pytestmark = pytest.mark.e2e
STEPS = 8
TRAIN_ARGS = ("--parallel.device", "cpu", *TINY, "--train.steps", str(STEPS), "--checkpoint.interval", "2")


def emulate(
    tmp: Path,
    name: str,
    *faults: str,
    reference: Path | None = None,
    cli: tuple[str, ...] = (),
    train_args: tuple[str, ...] = TRAIN_ARGS,
) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """Render with the CLI (``cli``: extra submit options; ``train_args``: the TrainJob's training arguments), run
    the emulator CLI; returns (process, report, fsx dir)."""
    _, _, text = render(name, *train_args, cli=cli)
    manifests = tmp / f"{name}.yaml"
    manifests.write_text(text)
    fsx, rep = tmp / "fsx", tmp / f"{name}-report.json"
    args = [
        "--runtime",
        str(manifests),
        "--trainjob",
        str(manifests),
        "--fsx-dir",
        str(fsx),
        "--workdir",
        str(tmp / f"{name}-pods"),
        "--master-port",
        "0",
        "--report",
        str(rep),
        "--timeout",
        "400",
    ]
    for f in faults:
        args += ["--fault", f]
    if reference is not None:
        args += ["--reference", str(reference)]
    r = subprocess.run(
        [sys.executable, "-m", "testbed.k8s_emulator", *args], cwd=ROOT, capture_output=True, text=True, timeout=480
    )
    report = json.loads(rep.read_text()) if rep.exists() else {}
    return r, report, fsx


def pod_logs(tmp: Path, name: str) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((tmp / f"{name}-pods").glob("*.log")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run of the same objects: its final checkpoint."""
    tmp = tmp_path_factory.mktemp("ref")
    ref, rep, fsx = emulate(tmp, "t5-contract-ref")
    assert ref.returncode == 0, ref.stdout + ref.stderr + pod_logs(tmp, "t5-contract-ref")
    assert rep["state"] == "Complete" and rep["jobset_restarts"] == 0
    assert rep["pods_created"] == {"node/0": 1, "node/1": 1}
    return fsx / "jobs/t5-contract-ref" / f"checkpoints/step_{STEPS:08d}"


#: The common verdict's checks of a run that recovered from its fault bitwise.
RECOVERED = (
    "fault injected",
    "failure noticed",
    "job restarted",
    "every sample exactly once",
    "weights bitwise == reference",
)


def passed(chaos: subprocess.CompletedProcess, rep: dict, tmp: Path, name: str, scenario: str, capsys) -> dict:
    """Show the emulator's report; the run completed as ``scenario`` and its verdict passed. Returns its checks
    (name -> detail)."""
    with capsys.disabled():
        print("\n" + chaos.stdout[chaos.stdout.find("===") :])
    assert chaos.returncode == 0, chaos.stdout + chaos.stderr + pod_logs(tmp, name)
    assert rep["state"] == "Complete" and rep["name"] == scenario
    assert rep["passed"], [c for c in rep["checks"] if not c["ok"]]
    return {c["name"]: c["detail"] for c in rep["checks"]}


def resumed_from_newest_checkpoint(rep: dict, fsx: Path, name: str) -> None:
    """Never resumed from older than the newest checkpoint known committed at the kill (an async save in flight
    may or may not complete), so only steps after that checkpoint are recomputed."""
    (rec,) = rep["recoveries"]
    assert rec["detect_s"] is not None and rec["recover_s"] is not None
    events = [json.loads(line) for line in (fsx / f"jobs/{name}/metrics.jsonl").read_text().splitlines()]
    t_fault = rep["events"][0]["time"]
    committed = [e["step"] for e in events if e["event"] == "checkpoint" and e["time"] < t_fault]
    restart = next(e for e in events if e["event"] == "start" and e["time"] > t_fault)
    # null = started from scratch: the first checkpoint's async save had not committed at the kill
    resumed = restart["resumed_from"] or 0
    # recomputed = the last step done before the new attempt started (the surviving pod may log one more
    # after the kill) - the step it resumed from
    last = max(e["step"] for e in events if e["event"] == "step" and e["time"] < restart["time"])
    assert max(committed, default=0) <= resumed <= last and rec["steps_lost"] == last - resumed


def test_kill_node0_pod_only_that_pod_is_replaced_resume_bitwise(tmp_path, reference, capsys):
    name = "t5-contract-chaos"
    chaos, rep, fsx = emulate(tmp_path, name, "kill:0@3", reference=reference)
    checks = passed(chaos, rep, tmp_path, name, "first-node-kill", capsys)
    assert {*RECOVERED, "only the failed pod was replaced"} <= set(checks)
    assert "pod failed" in checks["fault injected"]
    # the Job controller replaced node 0's pod alone; node 1 ran start to end; no gang restart
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 1
    assert rep["pods_created"] == {"node/0": 2, "node/1": 1}
    (old0, new0), (node1,) = rep["pods"]["node"]["0"], rep["pods"]["node"]["1"]
    assert old0["exit_code"] == 137 and new0["why"] == "replaced (Count)" and new0["pid"] != old0["pid"]
    assert node1["exit_code"] == 0 and node1["attempt"] == new0["attempt"] == 0  # exited at the end, on its own
    resumed_from_newest_checkpoint(rep, fsx, name)
    # rank 0 (node 0's pod, then its replacement) reported into TrainJob.status.trainerStatus: the run's end, with
    # the failures it survived read back from the run's records on FSx: the same as the run's goodput ledger (the
    # survivor may train alone before the replacement joins: a second, membership restart)
    status = rep["trainerStatus"]
    got = {m["name"]: m["value"] for m in status["metrics"]}
    assert status["progressPercentage"] == 100 and got["step"] == str(STEPS), status
    ledger = subprocess.run(
        [sys.executable, "-m", "training.goodput", str(fsx / f"jobs/{name}"), "--json", "--no-png"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    failures = json.loads(ledger.stdout)["failures"]
    assert failures and got["failures"] == str(len(failures)), (status, failures)
    assert got["last_failure"] == failures[-1]["how"][:100]
    assert rep["trainer_status_updates"]["accepted"] >= 2 and rep["trainer_status_updates"]["refused"] == 0


def test_with_a_hot_spare_pod_a_killed_training_pod_never_shrinks_the_world(tmp_path, reference, capsys):
    """`--spares 1`: three node pods, two train. SIGKILL a training pod (its node crashed): the next round takes
    a waiting agent in its place (same world size, bitwise result) and one pod ends as an unused spare. Which
    waiting agent (the spare, or the Job controller's replacement pod, which the emulator creates at once where a
    crashed node's takes minutes) is join order."""
    name = "t5-contract-spare"
    chaos, rep, fsx = emulate(tmp_path, name, "kill:training@3", reference=reference, cli=("--spares", "1"))
    with capsys.disabled():
        print("\n" + chaos.stdout[chaos.stdout.find("===") :])
    assert chaos.returncode == 0, chaos.stdout + chaos.stderr + pod_logs(tmp_path, name)
    assert rep["state"] == "Complete" and rep["passed"], [c for c in rep["checks"] if not c["ok"]]
    checks = {c["name"]: c["detail"] for c in rep["checks"]}
    assert "weights bitwise == reference" in checks and "pod failed" in checks["fault injected"]
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 1
    node_pods = rep["pods"]["node"]
    assert sorted(len(v) for v in node_pods.values()) == [1, 1, 2], node_pods  # only the killed index replaced
    killed = next(i for i, v in node_pods.items() if len(v) == 2)
    old, new = node_pods[killed]
    assert old["exit_code"] == 137 and new["why"] == "replaced (Count)"
    events = [json.loads(line) for line in (fsx / f"jobs/{name}/metrics.jsonl").read_text().splitlines()]
    assert {e["world_size"] for e in events if e["event"] == "start"} == {2}  # the world never shrank
    spare_line = "hot spare: the job finished without needing this node"
    logs = {p.name: p.read_text() for p in (tmp_path / f"{name}-pods").glob(f"{name}-node-*.log")}
    assert sum(text.count(spare_line) for text in logs.values()) == 1, {n: t[-1500:] for n, t in logs.items()}
    resumed_from_newest_checkpoint(rep, fsx, name)


def test_etcd_leader_killed_mid_training_nothing_restarts_bitwise(tmp_path, reference, capsys):
    """The membership store survives losing a member, the leader included: SIGKILL the etcd member that leads at
    step 3 (the StatefulSet brings it back on its volume 2 s later). No training pod fails or is recreated, no
    JobSet restart, one training attempt, and the final weights are bitwise those of the uninterrupted run."""
    name = "t5-contract-etcd"
    chaos, rep, fsx = emulate(tmp_path, name, "kill:etcd-leader@3", reference=reference)
    with capsys.disabled():
        print("\n" + chaos.stdout[chaos.stdout.find("===") :])
    assert chaos.returncode == 0, chaos.stdout + chaos.stderr + pod_logs(tmp_path, name)
    assert rep["state"] == "Complete" and rep["name"] == "store-member-kill" and rep["expected"] == "nothing restarted"
    assert rep["passed"], [c for c in rep["checks"] if not c["ok"]]
    checks = {c["name"]: c["detail"] for c in rep["checks"]}
    assert {"fault injected", "no pod restarted", "every sample exactly once", "weights bitwise == reference"} <= set(
        checks
    )
    assert "(leader)" in rep["events"][0]["label"] and "pod failed" in checks["fault injected"]
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 0
    assert rep["pods_created"] == {"node/0": 1, "node/1": 1}
    assert any(e["what"] == "etcd member restarted" for e in rep["pod_events"])
    events = [json.loads(line) for line in (fsx / f"jobs/{name}/metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("start") == 1


def test_single_replacement_check_fails_on_a_gang_restart():
    """Judged by the per-index promise (only the failed pod replaced), a gang restart fails."""
    from chaos.kubernetes import check_single_pod_replaced
    from chaos.verdict import Observation

    pods = {"node": {"0": [{"pid": 1}, {"pid": 3}], "1": [{"pid": 2}, {"pid": 4}]}}
    facts = {"jobset_restarts": 1, "pods": pods, "faulted": ["node/0"]}
    verdict = check_single_pod_replaced(Observation(records=[], faults=[], facts=facts))
    assert (
        not verdict.ok
        and "1 JobSet restart(s)" in verdict.detail
        and "recreated although not faulted" in verdict.detail
    )


def test_contract_verdict_fails_without_a_fault(tmp_path):
    """The emulator's verdict on a run whose only "fault" targets a node index that has no pod: nothing died,
    so the fault is unconfirmed and nothing restarted or was replaced; the run itself completes."""
    r, rep, _ = emulate(tmp_path, "t5-contract-nofault", "kill:7@3")
    assert rep["state"] == "Complete" and r.returncode == 1
    assert not rep.get("passed") and rep["jobset_restarts"] == 0
    failed = {c["name"]: c["detail"] for c in rep["checks"] if not c["ok"]}
    assert {"failure noticed", "only the failed pod was replaced"} <= set(failed)
    assert "no pod fault to replace" in failed["only the failed pod was replaced"]

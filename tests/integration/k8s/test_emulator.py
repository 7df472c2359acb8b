"""The emulator gives pods Trainer v2.3's env and applies Job/JobSet failure semantics (fast: tiny commands).

Runtime objects come from the EKS stack's own renderer (cluster_assets/k8s/runtime.py) and TrainJobs from
the submit CLI; only the container command is swapped for a few-line probe where a test needs one.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from testbed.k8s_emulator import ContractError, Emulator, Fault, render
from cluster_assets.k8s.runtime import build_cluster_training_runtime, replicated_job
from tests.support.k8s import render as render_cli


def runtime(max_restarts: int = 3, **kw) -> dict:
    return build_cluster_training_runtime(
        name="t5-fault-tolerant",
        pvc_name="fsx-claim",
        image="img:1",
        max_restarts=max_restarts,
        gpus_per_node=0,
        efa_per_node=0,
        **kw,
    )


@pytest.fixture(scope="module")
def rendered():
    rt, tj, _ = render_cli("t5-emu-unit", "--parallel.device", "cpu")
    return rt, tj


def with_command(tj: dict, code: str, *args: str) -> dict:
    tj = copy.deepcopy(tj)
    tj["spec"]["trainer"]["command"] = [sys.executable, "-c", code]
    tj["spec"]["trainer"]["args"] = list(args)
    return tj


def run(rt: dict, tj: dict, tmp: Path, timeout_s: float = 120, **kw) -> Emulator:
    emu = Emulator(rt, tj, fsx_dir=tmp / "fsx", workdir=tmp / "work", master_port=0, echo=None)
    emu.run(timeout_s=timeout_s, **kw)
    return emu


def pods(emu: Emulator) -> dict[str, int]:
    """Pods started per replicated job/index over the whole run."""
    return {f"{job}/{i}": len(recs) for job, by in emu.pods_by_index().items() for i, recs in by.items()}


def node_spec(rt: dict) -> dict:
    return replicated_job(rt, "node")["template"]["spec"]


PROBE = """import json, os, sys
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
client = EtcdClient(ClientCredentials.from_env())  # the cluster's etcd, as this job's user
client.put(client.key("probe/" + os.environ["PET_NODE_RANK"]), "here")
try:  # another job's prefix
    client.put("/t5-failover/jobs/someone-else/x", "1")
    other = "written"
except StoreRefused as e:
    other = str(e)
json.dump({"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "other_prefix": other,
           "mine": sorted(kv.key for kv in client.get_prefix(client.key("probe/"))[0])},
          open(os.path.join(out, os.environ["PET_NODE_RANK"] + ".json"), "w"))
"""


def test_pods_get_exactly_the_trainer_env(rendered, tmp_path):
    rt, tj = rendered
    emu = run(rt, with_command(tj, PROBE, "/fsx/probe"), tmp_path)
    assert emu.state == "Complete" and emu.restarts == 0
    for rank in (0, 1):
        got = json.loads((tmp_path / "fsx/probe" / f"{rank}.json").read_text())
        env = got["env"]
        assert {k: v for k, v in env.items() if k.startswith("PET_")} == {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(emu.master_port),
        }
        # runtime env + TrainJob env + PET_* + the TrainJob status endpoint + what the image provides; nothing else
        expected = {e["name"] for e in node_spec(rt)["template"]["spec"]["containers"][0]["env"]}
        expected |= {e["name"] for e in tj["spec"]["trainer"]["env"]}
        expected |= {
            "PET_NNODES",
            "PET_NPROC_PER_NODE",
            "PET_NODE_RANK",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT",
            "KUBEFLOW_TRAINER_SERVER_URL",
            "KUBEFLOW_TRAINER_SERVER_CA_CERT",
            "KUBEFLOW_TRAINER_SERVER_TOKEN",
            "PATH",
            "HOME",
            "HOSTNAME",
            "LANG",
        }
        assert set(env) - {"PWD", "LC_CTYPE"} == expected  # PWD/LC_CTYPE: set by the interpreter itself
        assert env["HOSTNAME"] == f"t5-emu-unit-node-0-{rank}"
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["TORCH_ELASTIC_WORKER_IDENTICAL"] == "1"
        # downward API (JobSet name and restart attempt) + $(VAR) expansion: one rendezvous per JobSet attempt
        assert env["JOBSET_NAME"] == "t5-emu-unit" and env["T5_RDZV_ID"] == "trainjob-t5-emu-unit-a0"
        assert env["T5_ETCD_ENDPOINTS"] == ",".join(emu.etcd.endpoints)  # the cluster's names -> local members
        assert env["T5_ETCD_USER"] == "job-t5-emu-unit" and env["T5_ETCD_PREFIX"] == "/t5-failover/jobs/t5-emu-unit/"
        assert got["argv"][1] == str((tmp_path / "fsx/probe").resolve())  # /fsx -> the local FSx stand-in


def test_pods_reach_the_clusters_etcd_as_their_job_only(rendered, tmp_path):
    """The runtime's client Secret + the TrainJob's password Secret (mounted by its runtimePatches) log each pod in
    as the job's etcd user: it writes under its prefix, never another job's."""
    rt, tj = rendered
    emu = run(rt, with_command(tj, PROBE, "/fsx/probe"), tmp_path)
    assert emu.state == "Complete" and pods(emu) == {"node/0": 1, "node/1": 1}
    for rank in (0, 1):
        got = json.loads((tmp_path / "fsx/probe" / f"{rank}.json").read_text())
        assert f"/t5-failover/jobs/t5-emu-unit/probe/{rank}" in got["mine"]
        assert "permission denied" in got["other_prefix"], got["other_prefix"]
        assert Path(got["env"]["T5_ETCD_PASSWORD_FILE"]).read_text()  # the Secret's file, as the pod sees it
    assert [e.what for e in emu.events].count("etcd started") == 1


def test_shipped_command_maps_pet_to_torchrun(rendered, tmp_path):
    """The real TrainJob command with the launcher's --print: the torchrun line every pod would exec."""
    rt, tj = rendered
    tj = copy.deepcopy(tj)
    cmd = tj["spec"]["trainer"]["command"]
    tj["spec"]["trainer"]["command"] = cmd[:-1] + ["--print", "--"]
    emu = run(rt, tj, tmp_path)
    assert emu.state == "Complete", emu.message
    for rank in (0, 1):
        log = (tmp_path / "work" / f"t5-emu-unit-node-0-{rank}-a0.log").read_text()
        assert "--nnodes=2:2" in log  # --min-nodes $(PET_NNODES) expanded by the kubelet rules
        assert "--nproc-per-node=1" in log
        # membership in the cluster's etcd (T5_ETCD_ENDPOINTS switches the launcher), one rendezvous per attempt
        assert "--rdzv-backend=t5-etcd" in log and "--rdzv-id=trainjob-t5-emu-unit-a0" in log
        assert "is_host=false" not in log and "--module training" in log
        assert f"--job.out_dir {(tmp_path / 'fsx').resolve()}/jobs/t5-emu-unit" in log
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in log


def test_crash_loops_use_the_per_index_retries_then_stop_at_max_restarts(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(max_restarts=1, retries_per_index=1), with_command(tj, "import sys; sys.exit(1)"), tmp_path)
    assert emu.state == "Failed"
    assert emu.restarts == 1 and "maxRestarts=1" in emu.message
    assert any("MaxFailedIndexesExceeded" in e.detail for e in emu.events if e.what == "Job failed")
    assert any("NodeRetriesExhausted" in e.detail for e in emu.events if e.what == "JobSet restart")
    # per attempt: an index fails, gets one retry, fails again -> the Job fails; the other index may still be on
    # its first pod (or its replacement) when that happens
    assert 2 <= pods(emu)["node/0"] + pods(emu)["node/1"] <= 8


def test_non_retryable_exit_code_fails_without_restart(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(), with_command(tj, "import sys; sys.exit(2)"), tmp_path)  # training: bad config
    assert emu.state == "Failed" and emu.restarts == 0
    assert "NonRetryableExitCode" in emu.message
    assert not any(e.what == "pod replaced by the Job controller" for e in emu.events)


# exits 0 on its second run; a first run waits to be disrupted (node 0: until node 1 has run twice)
SECOND_TIME_LUCKY = """import os, sys, time
d, rank = sys.argv[1], os.environ["PET_NODE_RANK"]
marker = os.path.join(d, "ran-" + rank)
os.makedirs(d, exist_ok=True)
if os.path.exists(marker):
    open(marker + "-again", "w").close()
    sys.exit(0)
open(marker, "w").close()
for _ in range(600):
    if rank == "0" and os.path.exists(os.path.join(d, "ran-1-again")):
        sys.exit(0)
    time.sleep(0.1)
"""


def ready(tmp: Path):
    return lambda: 1 if all((tmp / "fsx/m" / f"ran-{r}").exists() for r in (0, 1)) else 0


def test_a_killed_pod_is_replaced_alone(rendered, tmp_path):
    _, tj = rendered
    emu = run(
        runtime(max_restarts=0),
        with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"),
        tmp_path,
        faults=[Fault("kill", 1, 1)],
        progress=ready(tmp_path),
    )
    assert emu.state == "Complete", emu.message
    assert emu.restarts == 0 and pods(emu) == {"node/0": 1, "node/1": 2}
    (repl,) = [p for p in emu.pod_log if p.why.startswith("replaced")]
    assert repl.why == "replaced (Count)" and repl.env["HOSTNAME"] == "t5-emu-unit-node-0-1"


def test_eviction_replaces_the_pod_without_using_the_index_budget(rendered, tmp_path):
    _, tj = rendered
    emu = run(
        runtime(max_restarts=0, retries_per_index=0),
        with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"),
        tmp_path,
        faults=[Fault("evict", 1, 1)],
        progress=ready(tmp_path),
    )
    assert emu.state == "Complete", emu.message
    assert emu.restarts == 0 and pods(emu) == {"node/0": 1, "node/1": 2}
    assert [p.why for p in emu.pod_log if p.job == "node" and p.rank == 1] == ["created", "replaced (Ignore)"]


def test_no_retries_per_index_means_a_gang_restart(rendered, tmp_path):
    _, tj = rendered
    emu = run(
        runtime(max_restarts=3, retries_per_index=0),
        with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"),
        tmp_path,
        faults=[Fault("kill", 1, 1)],
        progress=ready(tmp_path),
    )
    assert emu.state == "Complete", emu.message
    assert emu.restarts == 1 and emu.restarts_towards_max == 1
    assert pods(emu) == {"node/0": 2, "node/1": 2}  # everything recreated


def test_kill_with_no_budget_fails(rendered, tmp_path):
    _, tj = rendered
    emu = run(
        runtime(max_restarts=0, retries_per_index=0),
        with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"),
        tmp_path,
        faults=[Fault("kill", 1, 1)],
        progress=ready(tmp_path),
    )
    assert emu.state == "Failed" and "maxRestarts=0" in emu.message


def test_fail_index_rule_fails_the_job_at_once(rendered, tmp_path):
    _, tj = rendered
    rt = runtime(max_restarts=0)
    node_spec(rt)["podFailurePolicy"]["rules"].insert(
        0, {"action": "FailIndex", "onExitCodes": {"containerName": "node", "operator": "In", "values": [9]}}
    )
    emu = run(
        rt,
        with_command(tj, "import os, sys, time; sys.exit(9) if os.environ['PET_NODE_RANK'] == '1' else time.sleep(60)"),
        tmp_path,
    )
    assert emu.state == "Failed" and "maximal number of failed indexes" in emu.message
    assert pods(emu)["node/1"] == 1  # FailIndex: no retry for that index


def test_without_failure_policy_the_first_failure_is_final(rendered, tmp_path):
    _, tj = rendered
    rt = runtime(retries_per_index=0)
    del rt["spec"]["template"]["spec"]["failurePolicy"]
    emu = run(rt, with_command(tj, "import sys; sys.exit(1)"), tmp_path)
    assert emu.state == "Failed" and emu.restarts == 0


@pytest.mark.parametrize(
    "breakage, match",
    [
        (lambda rt, tj: tj["spec"]["runtimeRef"].update(name="other"), "runtimeRef.name"),
        (lambda rt, tj: rt["spec"]["mlPolicy"].pop("torch"), "mlPolicy.torch"),
        (lambda rt, tj: replicated_job(rt, "node").update(name="trainer"), "must be 'node'"),
        (
            lambda rt, tj: node_spec(rt)["template"]["spec"]["containers"][0].update(name="main"),
            "no container named 'node'",
        ),
        (lambda rt, tj: tj["spec"]["trainer"]["env"].append({"name": "PET_NODE_RANK", "value": "0"}), "reserved"),
        (
            lambda rt, tj: replicated_job(rt, "node").update(dependsOn=[{"name": "nope", "status": "Ready"}]),
            "dependsOn",
        ),
        (
            lambda rt, tj: tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][
                0
            ].update(name="store"),
            "runtimePatches names replicated job 'store'",
        ),
        (lambda rt, tj: node_spec(rt).pop("backoffLimitPerIndex"), "maxFailedIndexes without backoffLimitPerIndex"),
        (
            lambda rt, tj: rt["spec"]["template"]["spec"]["successPolicy"].update(targetReplicatedJobs=["x"]),
            "successPolicy targets unknown",
        ),
    ],
)
def test_contract_violations_are_named(rendered, breakage, match):
    rt, tj = copy.deepcopy(rendered[0]), copy.deepcopy(rendered[1])
    breakage(rt, tj)
    with pytest.raises(ContractError, match=match):
        render(rt, tj)

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
from cluster_assets.k8s.runtime import build_cluster_training_runtime
from tests.k8s.helpers import render as render_cli


def runtime(max_restarts: int = 3, **kw) -> dict:
    return build_cluster_training_runtime(name="t5-fault-tolerant", pvc_name="fsx-claim", image="img:1",
                                          max_restarts=max_restarts, gpus_per_node=0, efa_per_node=0, **kw)


@pytest.fixture(scope="module")
def rendered():
    rt, tj, _ = render_cli("t5-emu-unit", "--parallel.device", "cpu")
    return rt, tj


def with_command(tj: dict, code: str, *args: str) -> dict:
    tj = copy.deepcopy(tj)
    tj["spec"]["trainer"]["command"] = [sys.executable, "-c", code]
    tj["spec"]["trainer"]["args"] = list(args)
    return tj


def run(rt: dict, tj: dict, tmp: Path, **kw) -> Emulator:
    emu = Emulator(rt, tj, fsx_dir=tmp / "fsx", workdir=tmp / "work", master_port=0, echo=None)
    emu.run(timeout_s=120, **kw)
    return emu


PROBE = """import json, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
json.dump({"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd()},
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
            "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(emu.master_port)}
        # runtime env + TrainJob env + PET_* + what the image provides; nothing else
        expected = {e["name"] for e in rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
                    ["template"]["spec"]["containers"][0]["env"]}
        expected |= {e["name"] for e in tj["spec"]["trainer"]["env"]}
        expected |= {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
                     "PATH", "HOME", "HOSTNAME", "LANG"}
        assert set(env) - {"PWD", "LC_CTYPE"} == expected  # PWD/LC_CTYPE: set by the interpreter itself
        assert env["HOSTNAME"] == f"t5-emu-unit-node-0-{rank}"
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert got["argv"][1] == str((tmp_path / "fsx/probe").resolve())  # /fsx -> the local FSx stand-in


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
        assert f"--rdzv-endpoint=127.0.0.1:{emu.master_port}" in log
        assert "--rdzv-backend=c10d" in log and "--module training" in log
        assert f"--job.out_dir {(tmp_path / 'fsx').resolve()}/jobs/t5-emu-unit" in log
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in log


def test_crash_loops_stop_at_max_restarts(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(max_restarts=2), with_command(tj, "import sys; sys.exit(1)"), tmp_path)
    assert emu.state == "Failed"
    assert emu.restarts == 2 and "maxRestarts=2" in emu.message


def test_non_retryable_exit_code_fails_without_restart(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(), with_command(tj, "import sys; sys.exit(2)"), tmp_path)  # training: bad config
    assert emu.state == "Failed" and emu.restarts == 0
    assert "NonRetryableExitCode" in emu.message


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


def test_eviction_restarts_without_using_the_budget(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(max_restarts=0), with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"), tmp_path,
              faults=[Fault("evict", 1, 1)], progress=ready(tmp_path))
    assert emu.state == "Complete", emu.message
    assert emu.restarts == 1 and emu.restarts_towards_max == 0


def test_kill_with_no_budget_fails(rendered, tmp_path):
    _, tj = rendered
    emu = run(runtime(max_restarts=0), with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"), tmp_path,
              faults=[Fault("kill", 1, 1)], progress=ready(tmp_path))
    assert emu.state == "Failed" and "maxRestarts=0" in emu.message


def test_without_backoff_limit_zero_only_the_failed_pod_is_replaced(rendered, tmp_path):
    """Why the runtime sets backoffLimit 0: Kubernetes' default (6) replaces just the dead pod (jobset#574)."""
    _, tj = rendered
    rt = runtime()
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    del job["backoffLimit"], job["podFailurePolicy"]
    emu = run(rt, with_command(tj, SECOND_TIME_LUCKY, "/fsx/m"), tmp_path, faults=[Fault("kill", 1, 1)],
              progress=ready(tmp_path))
    assert emu.state == "Complete" and emu.restarts == 0
    assert any(e.what == "pod replaced by the Job controller" for e in emu.events)


def test_without_failure_policy_the_first_failure_is_final(rendered, tmp_path):
    _, tj = rendered
    rt = runtime()
    del rt["spec"]["template"]["spec"]["failurePolicy"]
    emu = run(rt, with_command(tj, "import sys; sys.exit(1)"), tmp_path)
    assert emu.state == "Failed" and emu.restarts == 0


@pytest.mark.parametrize("breakage, match", [
    (lambda rt, tj: tj["spec"]["runtimeRef"].update(name="other"), "runtimeRef.name"),
    (lambda rt, tj: rt["spec"]["mlPolicy"].pop("torch"), "mlPolicy.torch"),
    (lambda rt, tj: rt["spec"]["template"]["spec"]["replicatedJobs"][0].update(name="trainer"), "must be 'node'"),
    (lambda rt, tj: rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
     ["containers"][0].update(name="main"), "no container named 'node'"),
    (lambda rt, tj: tj["spec"]["trainer"]["env"].append({"name": "PET_NODE_RANK", "value": "0"}), "reserved"),
])
def test_contract_violations_are_named(rendered, breakage, match):
    rt, tj = copy.deepcopy(rendered[0]), copy.deepcopy(rendered[1])
    breakage(rt, tj)
    with pytest.raises(ContractError, match=match):
        render(rt, tj)

"""The shipped ClusterTrainingRuntime + TrainJob run end to end under Trainer v2.3 / JobSet semantics.

Rendered by the submit CLI exactly as `make train PLATFORM=eks DRY_RUN=1` prints them (CPU shape supplied
as user overrides), run by the contract emulator as real processes (launcher -> torchrun -> training):
kill one pod -> Job fails (backoffLimit 0) -> JobSet gang restart -> resume -> finish. The emulator judges
the run with the common chaos verdict (fault confirmed, noticed, restarted, steps recomputed, completed,
every sample exactly once, final weights bitwise equal to an uninterrupted run of the same objects).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY
from tests.k8s.helpers import render

pytestmark = pytest.mark.e2e
STEPS = 8
TRAIN_ARGS = ("--parallel.device", "cpu", *TINY, "--train.steps", str(STEPS), "--checkpoint.interval", "2")


def emulate(tmp: Path, name: str, *faults: str, reference: Path | None = None,
            ) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """Render with the CLI, run the emulator CLI; returns (process, report, fsx dir)."""
    _, _, text = render(name, *TRAIN_ARGS)
    manifests = tmp / f"{name}.yaml"
    manifests.write_text(text)
    fsx, rep = tmp / "fsx", tmp / f"{name}-report.json"
    args = ["--runtime", str(manifests), "--trainjob", str(manifests), "--fsx-dir", str(fsx),
            "--workdir", str(tmp / f"{name}-pods"), "--master-port", "0", "--report", str(rep), "--timeout", "400"]
    for f in faults:
        args += ["--fault", f]
    if reference is not None:
        args += ["--reference", str(reference)]
    r = subprocess.run([sys.executable, "-m", "testbed.k8s_emulator", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=480)
    report = json.loads(rep.read_text()) if rep.exists() else {}
    return r, report, fsx


def pod_logs(tmp: Path, name: str) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((tmp / f"{name}-pods").glob("*.log")))


def test_kill_pod_gang_restart_resume_bitwise(tmp_path, capsys):
    ref, ref_rep, fsx = emulate(tmp_path, "t5-contract-ref")
    assert ref.returncode == 0, ref.stdout + ref.stderr + pod_logs(tmp_path, "t5-contract-ref")
    assert ref_rep["state"] == "Complete" and ref_rep["jobset_restarts"] == 0
    final = f"checkpoints/step_{STEPS:08d}"

    chaos, rep, _ = emulate(tmp_path, "t5-contract-chaos", "kill:1@3", reference=fsx / "jobs/t5-contract-ref" / final)
    with capsys.disabled():
        print("\n" + chaos.stdout[chaos.stdout.find("==="):])
    assert chaos.returncode == 0, chaos.stdout + chaos.stderr + pod_logs(tmp_path, "t5-contract-chaos")
    assert rep["state"] == "Complete" and rep["name"] == "node-kill"
    assert rep["passed"], [c for c in rep["checks"] if not c["ok"]]
    checks = {c["name"]: c["detail"] for c in rep["checks"]}
    assert {"fault injected", "failure noticed", "job restarted", "every sample exactly once",
            "weights bitwise == reference", "JobSet restarted the gang"} <= set(checks)
    assert "pod failed" in checks["fault injected"]
    assert rep["jobset_restarts"] == 1, "one pod failure must restart the whole gang exactly once"
    assert rep["pod_failures"] == 1
    (rec,) = rep["recoveries"]
    assert rec["detect_s"] is not None and rec["recover_s"] is not None
    # never resumed from older than the newest checkpoint known committed at the kill (an async save in
    # flight may or may not complete), so only steps after that checkpoint are recomputed
    events = [json.loads(line) for line in (fsx / "jobs/t5-contract-chaos/metrics.jsonl").read_text().splitlines()]
    t_fault = rep["events"][0]["time"]
    committed = [e["step"] for e in events if e["event"] == "checkpoint" and e["time"] < t_fault]
    restart = next(e for e in events if e["event"] == "start" and e["time"] > t_fault)
    # null = started from scratch: the first checkpoint's async save had not committed at the kill
    resumed = restart["resumed_from"] or 0
    # recomputed = the last step done before the new attempt started (the surviving pod may log one more
    # after the kill) - the step it resumed from
    last = max(e["step"] for e in events if e["event"] == "step" and e["time"] < restart["time"])
    assert max(committed, default=0) <= resumed <= last and rec["steps_lost"] == last - resumed
    # every pod of the restart attempt ran, not just the replaced one
    assert [e["what"] for e in rep["pod_events"]].count("pods started") == 2


def test_contract_verdict_fails_without_a_fault(tmp_path):
    """The emulator's verdict on a run whose only "fault" targets a node index that has no pod: nothing died,
    so the fault is unconfirmed and nothing restarted; the run itself completes."""
    r, rep, _ = emulate(tmp_path, "t5-contract-nofault", "kill:7@3")
    assert rep["state"] == "Complete" and r.returncode == 1
    assert not rep.get("passed") and rep["jobset_restarts"] == 0

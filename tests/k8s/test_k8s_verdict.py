"""The Kubernetes chaos verdict (contract emulator and live EKS) on hand-made pod events and metrics."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from chaos import kubernetes as k8s

STEPS, GB = 8, 8
ARGS = ["--preset", "debug", "--train.steps", str(STEPS), "--checkpoint.interval", "2"]


def metrics(tmp: Path, resumed: int | None) -> Path:
    """Steps 1-3 (checkpoint 2), then, if ``resumed`` is set, a new attempt from it to the end; else straight on."""
    ev = [{"event": "start", "time": 0.0, "resumed_from": None, "world_size": 2}]
    ev += [{"event": "step", "time": float(n), "step": n, "loss": 9.0, "world_size": 2, "step_time_s": 1.0,
            "data_offset": (n - 1) * GB} for n in range(1, 4)]
    ev.append({"event": "checkpoint", "time": 2.5, "step": 2})
    first = 4
    if resumed is not None:
        ev.append({"event": "start", "time": 20.0, "resumed_from": resumed, "world_size": 2})
        first = resumed + 1
    base = 20.0 if resumed is not None else 0.0
    ev += [{"event": "step", "time": base + n, "step": n, "loss": 9.0, "world_size": 2, "step_time_s": 1.0,
            "data_offset": (n - 1) * GB} for n in range(first, STEPS + 1)]
    ev.append({"event": "end", "time": base + STEPS + 1, "step": STEPS})
    p = tmp / "job" / "metrics.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(json.dumps(e) for e in ev) + "\n")
    return p


def emulator(fault_logged: bool, pod_died: bool, restarts: int):
    ev = SimpleNamespace
    events = [ev(time=0.0, what="pods started", detail="job-node-0-0, job-node-1-0")]
    log = []
    if fault_logged:
        log.append({"label": "kill node-1 pod", "time": 3.5, "step": 3, "pod": "job-node-1-0", "kind": "kill", "rank": 1})
        events.append(ev(time=3.5, what="fault kill", detail="node 1 pod job-node-1-0 at step 3"))
    if pod_died:
        events += [ev(time=3.6, what="pod failed", detail="job-node-1-0 exit -9, conditions -"),
                   ev(time=3.7, what="Job failed", detail="BackoffLimitExceeded")]
    events.append(ev(time=30.0, what="TrainJob Complete", detail=""))
    r = SimpleNamespace(command=["python", "-m", "training.launch", "--", *ARGS], job_name="job", max_restarts=10,
                        num_nodes=2, nproc_per_node=1)
    return SimpleNamespace(r=r, fault_log=log, events=events, state="Complete", message="", restarts=restarts,
                           pod_failures=int(pod_died), differences=lambda: [])


def test_pod_kill_with_gang_restart_passes_except_unchecked_weights(tmp_path):
    rep = k8s.emulator_result(emulator(True, True, 1), metrics(tmp_path, resumed=2), 0.0, None, judged=True)
    failed = {c["name"] for c in rep["checks"] if not c["ok"]}
    # no checkpoint files here, so completion and weights cannot be shown; every evidence check holds
    assert failed == {"completed", "weights bitwise == reference"}
    assert rep["name"] == "node-kill"
    (r,) = rep["recoveries"]
    assert r["steps_lost"] == 1 and abs(r["detect_s"] - 0.2) < 1e-9 and abs(r["recover_s"] - (23 - 3.5)) < 1e-9
    text = k8s.format_report(rep)
    assert "TrainJob job: Complete" in text and "node-kill" in text and "NO weights bitwise" in text


def test_verdict_fails_without_the_fault(tmp_path):
    """The fault was asked for but no pod died: unconfirmed, nothing noticed, no restart, no JobSet restart."""
    rep = k8s.emulator_result(emulator(True, False, 0), metrics(tmp_path, resumed=None), 0.0, None, judged=True)
    failed = {c["name"]: c["detail"] for c in rep["checks"] if not c["ok"]}
    assert not rep["passed"]
    assert "never failed" in failed["fault injected"]
    assert {"failure noticed", "job restarted", "JobSet restarted the gang"} <= set(failed)


def test_fault_skipped_by_the_emulator_fails(tmp_path):
    rep = k8s.emulator_result(emulator(False, False, 0), metrics(tmp_path, resumed=None), 0.0, None, judged=True)
    assert not rep["passed"] and rep["name"] == "no-fault"
    assert any(c["name"] == "fault injected" and not c["ok"] for c in rep["checks"])


def test_scenario_names_match_the_catalog():
    from chaos.catalog import PLATFORMS
    names = {k8s.scenario_name(kind, rank) for kind in ("kill", "delete", "evict") for rank in (0, 1)}
    assert names == set(PLATFORMS["eks"])

"""The Kubernetes chaos verdict (contract emulator and live EKS) on hand-made pod events and metrics."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos import kubernetes as k8s

STEPS, GB = 8, 8
ARGS = ["--preset", "debug", "--train.steps", str(STEPS), "--checkpoint.interval", "2"]


def metrics(tmp: Path, resumed: int | None) -> Path:
    """Steps 1-3 (checkpoint 2), then, if ``resumed`` is set, a new attempt from it to the end; else straight on."""
    ev = [{"event": "start", "time": 0.0, "resumed_from": None, "world_size": 2}]
    ev += [
        {
            "event": "step",
            "time": float(n),
            "step": n,
            "loss": 9.0,
            "world_size": 2,
            "step_time_s": 1.0,
            "data_offset": (n - 1) * GB,
        }
        for n in range(1, 4)
    ]
    ev.append({"event": "checkpoint", "time": 2.5, "step": 2})
    first = 4
    if resumed is not None:
        ev.append({"event": "start", "time": 20.0, "resumed_from": resumed, "world_size": 2})
        first = resumed + 1
    base = 20.0 if resumed is not None else 0.0
    ev += [
        {
            "event": "step",
            "time": base + n,
            "step": n,
            "loss": 9.0,
            "world_size": 2,
            "step_time_s": 1.0,
            "data_offset": (n - 1) * GB,
        }
        for n in range(first, STEPS + 1)
    ]
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
        log.append(
            {"label": "kill node-1 pod", "time": 3.5, "step": 3, "pod": "job-node-1-0", "kind": "kill", "rank": 1}
        )
        events.append(ev(time=3.5, what="fault kill", detail="node 1 pod job-node-1-0 at step 3"))
    if pod_died:
        events += [
            ev(time=3.6, what="pod failed", detail="job-node-1-0 exit -9, conditions -"),
            ev(time=3.7, what="Job failed", detail="BackoffLimitExceeded"),
        ]
    events.append(ev(time=30.0, what="TrainJob Complete", detail=""))
    r = SimpleNamespace(
        command=["python", "-m", "training.launch", "--", *ARGS],
        job_name="job",
        max_restarts=10,
        num_nodes=2,
        nproc_per_node=1,
    )
    return SimpleNamespace(
        r=r,
        fault_log=log,
        events=events,
        state="Complete",
        message="",
        restarts=restarts,
        pod_failures=int(pod_died),
        differences=lambda: [],
    )


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


def pod(job: str, index: int, pid: int, why: str = "created", attempt: int = 0) -> dict:
    return {
        "job": job,
        "index": index,
        "name": f"job-{job}-0-{index}",
        "pid": pid,
        "attempt": attempt,
        "why": why,
        "started": 0.0,
        "ended": 30.0,
        "exit_code": 0,
    }


def per_index_emulator(restarts: int, pods: dict):
    emu = emulator(True, True, restarts)
    emu.r.backoff_limit_per_index = 3
    emu.pods_by_index = lambda: pods
    return emu


ONLY_NODE1 = {
    "store": {"0": [pod("store", 0, 10)]},
    "node": {"0": [pod("node", 0, 11)], "1": [pod("node", 1, 12), pod("node", 1, 13, "replaced (Count)")]},
}
GANG = {
    "store": {"0": [pod("store", 0, 10), pod("store", 0, 20, "JobSet restart", 1)]},
    "node": {
        "0": [pod("node", 0, 11), pod("node", 0, 21, "JobSet restart", 1)],
        "1": [pod("node", 1, 12), pod("node", 1, 22, "JobSet restart", 1)],
    },
}


def test_per_index_run_is_judged_by_single_pod_replacement(tmp_path):
    rep = k8s.emulator_result(per_index_emulator(0, ONLY_NODE1), metrics(tmp_path, resumed=2), 0.0, None, judged=True)
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["expected"] == "only the failed pod replaced" and "JobSet restarted the gang" not in checks
    assert checks["only the failed pod was replaced"]["ok"], checks["only the failed pod was replaced"]["detail"]
    assert "node/1 pids 12->13" in checks["only the failed pod was replaced"]["detail"]
    assert rep["pods_created"] == {"store/0": 1, "node/0": 1, "node/1": 2}


@pytest.mark.parametrize(
    "restarts, pods, why",
    [
        (1, GANG, "1 JobSet restart(s)"),  # a gang restart is not a single-pod replacement
        (0, GANG, "recreated although not faulted"),  # every pod recreated, even without a restart counted
        (
            0,
            {"store": ONLY_NODE1["store"], "node": {"0": ONLY_NODE1["node"]["0"], "1": [pod("node", 1, 12)]}},
            "never recreated",
        ),  # the faulted pod was not replaced
    ],
)
def test_single_pod_replacement_fails_otherwise(tmp_path, restarts, pods, why):
    rep = k8s.emulator_result(per_index_emulator(restarts, pods), metrics(tmp_path, resumed=2), 0.0, None, judged=True)
    (check,) = [c for c in rep["checks"] if c["name"] == "only the failed pod was replaced"]
    assert not check["ok"] and why in check["detail"] and not rep["passed"]


def test_live_harness_reads_the_promise_from_the_installed_runtime():
    from cluster_assets.k8s.runtime import build_cluster_training_runtime

    kw = dict(name="rt", pvc_name="pvc", image="img:1", max_restarts=1, gpus_per_node=0, efa_per_node=0)
    assert k8s.runtime_retries_per_index(build_cluster_training_runtime(**kw)) == 3
    assert k8s.runtime_retries_per_index(build_cluster_training_runtime(**kw, retries_per_index=0)) == 0

"""Kubernetes chaos verdicts, shared by the contract emulator (pods as local processes) and the live EKS harness.

Both hand the core (``chaos.verdict``) the same kind of observation: the job's metrics records, the faults with
the evidence that each pod really died, the times the JobSet noticed (a Job failed / the JobSet restarted),
whether the TrainJob completed, and the final weights compared with an uninterrupted reference run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.report import ScenarioResult
from chaos.verdict import Check, Expectation, Fault, Observation, compare_weights, judge
from testbed.k8s_worker_kill import KILL_WORKER

# Fault kinds of the emulator / the live harness -> the catalog's names.
KIND_NAMES = {"kill": "node-kill", "delete": "node-kill", "evict": "node-drain", "freeze-agents": "split-brain"}
#: The split brain's promise on Kubernetes (the runtime's podFailurePolicy sends exit 9 to Ignore).
FENCED_PODS_REPLACED = "the fenced pods exited 9 and were replaced uncounted (Ignore), no JobSet restart"


def scenario_name(kind: str, rank: int, job: str = "node") -> str:
    """The catalog name of a pod fault: losing node 0's pod is first-node-kill whatever the kind; a fault on
    another replicated job's pod is ``<job>-kill``; an etcd member's is ``store-member-kill``."""
    if job == "etcd":
        return "store-member-kill"
    if job != "node":
        return f"{job}-kill" if kind != "evict" else f"{job}-drain"
    return "first-node-kill" if rank == 0 and kind != "evict" else KIND_NAMES[kind]


def expectation(interval: int | None) -> Expectation:
    """Every pod fault: noticed, the gang re-formed and trained, at most two intervals recomputed (the newest
    save may still be in flight when the pod dies, and the kill can land a step after it was triggered)."""
    return Expectation(max_steps_lost=None if interval is None else 2 * interval)


def check_jobset_restarts(obs: Observation) -> Check:
    """One JobSet restart per fault at least: the runtime's failure policy, not luck, brought the job back."""
    n, want = obs.facts.get("jobset_restarts", 0), len(obs.faults)
    return Check("JobSet restarted the gang", n >= want, f"{n} JobSet restart(s) for {want} fault(s)")


def check_single_pod_replaced(obs: Observation) -> Check:
    """Per-index retry: the faulted pods' indexes got a new pod, every other pod (the store's included) ran from
    start to end as the same process, and the JobSet never restarted.

    Facts: ``pods`` ({job: {index: [pod records in start order]}}, each with ``pid`` (emulator) or ``uid`` (a
    cluster)), ``faulted`` (the ``job/index`` keys the faults hit), ``jobset_restarts``.
    """
    pods, faulted = obs.facts.get("pods") or {}, set(obs.facts.get("faulted") or [])
    restarts = obs.facts.get("jobset_restarts", 0)
    problems, kept, replaced = [], [], []
    for job, by_index in sorted(pods.items()):
        for index, recs in sorted(by_index.items()):
            key = f"{job}/{index}"
            pids = "->".join(str(r.get("pid") or r.get("uid")) for r in recs)
            if key in faulted:
                (replaced if len(recs) >= 2 else problems).append(
                    f"{key} pids {pids}" + ("" if len(recs) >= 2 else " (never recreated)")
                )
            elif len(recs) != 1:
                problems.append(f"{key} recreated although not faulted (pids {pids})")
            else:
                kept.append(f"{key} pid {pids}")
    missing = faulted - {f"{j}/{i}" for j, by in pods.items() for i in by}
    problems += [f"{k}: no such pod" for k in sorted(missing)]
    if not faulted:
        problems.append("no pod fault to replace")
    if restarts:
        problems.append(f"{restarts} JobSet restart(s)")
    detail = f"replaced: {', '.join(replaced) or '-'}; kept: {', '.join(kept) or '-'}; JobSet restarts {restarts}" + (
        f"; NOT: {'; '.join(problems)}" if problems else ""
    )
    return Check("only the failed pod was replaced", not problems, detail)


def check_fenced_pods_replaced(obs: Observation) -> Check:
    """The split brain's end on Kubernetes: every pod of the replaced group (``faulted``) exited 9 (the commit fence)
    and its index got one new pod without a counted failure (``replaced (Ignore)``), which ended 0 (a hot spare never
    needed); every other pod (the newer group's) ran start to end as one process; no JobSet restart; the TrainJob
    Complete.

    Facts: ``pods`` ({job: {index: [pod records in start order]}}), ``faulted``, ``jobset_restarts``,
    ``trainjob_state``.
    """
    pods, faulted = obs.facts.get("pods") or {}, set(obs.facts.get("faulted") or [])
    restarts, state = obs.facts.get("jobset_restarts", 0), obs.facts.get("trainjob_state")
    problems, fenced, kept = [], [], []
    for job, by_index in sorted(pods.items()):
        for index, recs in sorted(by_index.items()):
            key = f"{job}/{index}"
            chain = " -> ".join(f"{r.get('why')}, exit {r.get('exit_code')}" for r in recs)
            if key not in faulted:
                (kept if len(recs) == 1 else problems).append(
                    f"{key} ({chain})" + ("" if len(recs) == 1 else " recreated although not in the fenced group")
                )
            elif (
                len(recs) == 2
                and recs[0].get("exit_code") == 9
                and recs[1].get("why") == "replaced (Ignore)"
                and recs[1].get("exit_code") == 0
            ):
                fenced.append(f"{key} ({chain})")
            else:
                problems.append(f"{key} ({chain}) not one exit 9 then one uncounted replacement that ended 0")
    problems += [f"{k}: no such pod" for k in sorted(faulted - {f"{j}/{i}" for j, by in pods.items() for i in by})]
    if not faulted:
        problems.append("no fenced group (no fault)")
    if restarts:
        problems.append(f"{restarts} JobSet restart(s)")
    if state != "Complete":
        problems.append(f"TrainJob {state}")
    detail = (
        f"fenced: {', '.join(fenced) or '-'}; kept: {', '.join(kept) or '-'}; JobSet restarts {restarts}; "
        f"TrainJob {state}" + (f"; NOT: {'; '.join(problems)}" if problems else "")
    )
    return Check(FENCED_PODS_REPLACED, not problems, detail)


def check_nothing_restarted(obs: Observation) -> Check:
    """An etcd member lost (the leader included): no training pod failed or was recreated, no JobSet restart, and the
    job trained in one attempt (one ``start`` in its metrics)."""
    pods, restarts = obs.facts.get("pods") or {}, obs.facts.get("jobset_restarts", 0)
    recreated = [f"{job}/{i}" for job, by in pods.items() for i, recs in by.items() if len(recs) != 1]
    starts = sum(1 for r in obs.records if r.get("event") == "start")
    ok = not recreated and not restarts and starts == 1 and bool(pods)
    return Check(
        "no pod restarted",
        ok,
        f"training pods recreated: {', '.join(recreated) or 'none'}; JobSet restarts "
        f"{restarts}; training attempts {starts}",
    )


def check_no_pod_replaced(obs: Observation) -> Check:
    """A worker killed inside a pod (``kill-worker``): its container lives on (PID 1 is the agent), so no pod failed
    or was recreated and the JobSet never restarted; what follows is the agents' business (in place, or their
    worker-group restart)."""
    pods, restarts = obs.facts.get("pods") or {}, obs.facts.get("jobset_restarts", 0)
    recreated = [f"{job}/{i}" for job, by in pods.items() for i, recs in by.items() if len(recs) != 1]
    ok = bool(pods) and not recreated and not restarts and bool(obs.faults)
    return Check(
        "no pod replaced, no JobSet restart",
        ok,
        f"pods recreated: {', '.join(recreated) or 'none'} of {sum(len(by) for by in pods.values())}; JobSet restarts "
        f"{restarts}" + ("" if obs.faults else "; no fault"),
    )


def worker_kills_only(emu: Any) -> bool:
    return bool(emu.fault_log) and all(f.get("kind") == KILL_WORKER for f in emu.fault_log)


def in_place_settings(train_argv: list[str]) -> tuple[bool, int]:
    """(failover.in_place, the in-memory snapshot interval in steps: 1 for ``auto``) of a TrainJob's arguments."""
    from training.config import load_config

    c = load_config(list(train_argv))
    mi = c.checkpoint.memory_interval
    return bool(c.failover.in_place), mi if isinstance(mi, int) else 1


def member_faults_only(emu: Any) -> bool:
    return bool(emu.fault_log) and all(f.get("job") == "etcd" for f in emu.fault_log)


def split_brain_only(emu: Any) -> bool:
    return bool(emu.fault_log) and all(f.get("kind") == "freeze-agents" for f in emu.fault_log)


def pod_logs(emu: Any) -> list[tuple[float, str]]:
    """Every node pod's output (agent and workers), each line stamped with its pod's end (or start)."""
    out = []
    for p in emu.pod_log if hasattr(emu, "pod_log") else []:
        if p.job == "node":
            try:
                text = Path(p.log_path).read_text(errors="replace")
            except OSError:
                continue
            out += [(p.ended or p.started, line) for line in text.splitlines()]
    return out


def runtime_retries_per_index(runtime: dict) -> int:
    """``backoffLimitPerIndex`` of a runtime's node Job (0 when unset: every pod failure is a gang restart)."""
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rj["name"] == "node":
            return int(rj["template"]["spec"].get("backoffLimitPerIndex") or 0)
    return 0


def expects_single_replacement(emu: Any) -> bool:
    """What the rendered runtime promises for the run's faults: per-index retry of the node Job
    (``backoffLimitPerIndex`` >= 1) replaces a faulted training pod alone; any other fault (the store, or a
    runtime without per-index retry) is a JobSet gang restart."""
    per_index = getattr(emu.r, "backoff_limit_per_index", None) or 0
    # no fault logged (asked for but nothing to hit): still judged by the runtime's promise, which then fails
    return per_index >= 1 and all(f.get("job", "node") == "node" for f in emu.fault_log)


def training_shape(train_argv: list[str]) -> tuple[int, int, int]:
    """(steps, global_batch, checkpoint interval) the training CLI resolves from a TrainJob's arguments."""
    from training.config import load_config

    c = load_config(list(train_argv))
    return c.train.steps, c.train.global_batch, c.checkpoint.interval


def emulator_result(emu: Any, metrics_path: Path, t0: float, reference: Path | None, judged: bool) -> dict[str, Any]:
    """Judge one emulator run (``judged``: faults were asked for) and return its JSON report.

    Evidence per fault: the emulator logged the target pod failing after it; "noticed" = a Job failed or the
    Job controller replaced the pod. The run must show what the runtime promises for its faults
    (:func:`expects_single_replacement`): only the faulted pods replaced, or a JobSet gang restart per fault.
    The split brain (``freeze-agents``) is confirmed by the emulator's own evidence (the agents stopped while their
    workers ran on, the spares formed a second group: noticed then, by etcd), and judged by the fence's evidence
    (:func:`chaos.local.split_brain.check_stale_group_fenced`) and :func:`check_fenced_pods_replaced`.
    """
    from chaos.local.scenarios import (
        check_rank0_joined_in_place,
        check_recomputed_in_place,
        check_survivors_kept_after_node_loss,
        check_survivors_kept_in_place,
    )
    from chaos.local.split_brain import check_stale_group_fenced
    from training.goodput.analysis import load_records

    records = load_records(metrics_path)
    cmd = list(emu.r.command)
    train_argv = cmd[cmd.index("--") + 1 :] if "--" in cmd else []
    steps, global_batch, interval = training_shape(train_argv)
    in_place, memory_interval = in_place_settings(train_argv)
    faults, names = [], []
    for f in emu.fault_log:
        if "confirmed" in f:  # the fault's own evidence (freeze-agents, kill-worker)
            faults.append(Fault(f["label"], f["time"], f["confirmed"], f["evidence"]))
            if f["kind"] == KILL_WORKER:
                names.append("worker-kill-in-place" if in_place else "worker-kill")
            else:
                names.append(scenario_name(f["kind"], f["rank"], f.get("job", "node")))
            continue
        died = next(
            (
                ev
                for ev in emu.events
                if ev.time >= f["time"] and f["pod"] in ev.detail and ev.what in ("pod failed", "pods terminated")
            ),
            None,
        )
        faults.append(
            Fault(
                f["label"],
                f["time"],
                died is not None,
                f"{died.what}: {died.detail[:120]}" if died else f"pod {f['pod']} never failed",
            )
        )
        names.append(scenario_name(f["kind"], f["rank"], f.get("job", "node")))
    out_dir = metrics_path.parent
    final = out_dir / "checkpoints" / f"step_{steps:08d}"
    ref_records = load_records(reference.parent.parent / "metrics.jsonl") if reference else []
    pods = emu.pods_by_index() if hasattr(emu, "pods_by_index") else {}
    faulted = sorted({k for f in emu.fault_log for k in f.get("faulted") or [f"{f.get('job', 'node')}/{f['rank']}"]})
    single = expects_single_replacement(emu)
    members = member_faults_only(emu)  # the membership store's loss must cost nothing
    split = split_brain_only(emu)
    workers = worker_kills_only(emu)
    kills = getattr(emu, "worker_kills", [])
    # in place, a node pod lost while a spare pod waited: the spare's workers join the survivors' running epoch
    losses = [loss for loss in getattr(emu, "pod_losses", []) if loss.spares] if in_place and single else []
    if losses and len(losses) == len(emu.fault_log):
        names = [loss.in_place_scenario for loss in losses]
    else:
        losses = []
    obs = Observation(
        records=records,
        faults=faults,
        # "second group": etcd formed a newer round without the frozen agents (freeze-agents)
        detections=[
            ev.time
            for ev in emu.events
            if ev.what in ("Job failed", "pod replaced by the Job controller", "second group", "worker failure noticed")
        ],
        exited_ok={"Complete": True, "Failed": False}.get(emu.state),
        exit_detail=f"TrainJob {emu.state}",
        steps=steps,
        global_batch=global_batch,
        final_committed=(final / "COMMITTED.json").exists(),
        weight_diffs=compare_weights(final, reference) if reference else None,
        reference_records=ref_records,
        wall_s=(emu.events[-1].time - t0) if emu.events else 0.0,
        logs=pod_logs(emu) if split or workers else [],  # (in place: the agents' lines about blocked workers)
        checkpoint_dir=out_dir / "checkpoints",
        facts={
            "jobset_restarts": emu.restarts,
            "pods": pods,
            "faulted": faulted,
            "trainjob_state": emu.state,
            "memory_interval": memory_interval,
            **({"in_place_kill": kills[0].facts()} if kills else {}),
            **({"in_place_kill": losses[0].facts()} if losses else {}),
        },
    )
    res = ScenarioResult(
        name=",".join(names) or "no-fault",
        title="pod faults under Trainer v2.3 + JobSet",
        t0=t0,
        workdir=str(out_dir),
        events=[{"time": f.time, "kind": "fault", "label": f.label} for f in faults],
        figures={"JobSet restarts": emu.restarts, "pod failures": emu.pod_failures},
    )
    res.wall_s = obs.wall_s
    if judged and members:
        res.apply(judge(obs, Expectation(restart=False, noticed=False), [check_nothing_restarted]))
    elif judged and workers and in_place:  # the killed worker replaced alone, its peers kept, no restart
        res.apply(
            judge(
                obs,
                Expectation(restart=False),
                [check_no_pod_replaced, check_survivors_kept_in_place, check_recomputed_in_place],
            )
        )
    elif judged and losses:  # the lost pod alone replaced, the survivors' workers kept, no restart
        res.apply(
            judge(
                obs,
                Expectation(restart=False),
                [check_single_pod_replaced, check_survivors_kept_after_node_loss, check_recomputed_in_place]
                + ([check_rank0_joined_in_place] if losses[0].rank0 else []),
            )
        )
    elif judged and workers:  # the agents' worker-group restart, inside the pods
        res.apply(judge(obs, expectation(interval), [check_no_pod_replaced]))
    elif judged and split:
        res.apply(judge(obs, expectation(interval), [check_stale_group_fenced, check_fenced_pods_replaced]))
    elif judged:
        res.apply(judge(obs, expectation(interval), [check_single_pod_replaced if single else check_jobset_restarts]))
    res.timeline = [r for r in records if r["event"] in ("step", "start", "signal", "checkpoint", "end")]
    rep = res.to_json()
    rep.update(
        title="Kubernetes contract emulator (Trainer v2.3 + JobSet semantics, pods as local processes)",
        trainjob=emu.r.job_name,
        state=emu.state,
        message=emu.message,
        jobset_restarts=emu.restarts,
        max_restarts=emu.r.max_restarts,
        pod_failures=emu.pod_failures,
        nodes=emu.r.num_nodes,
        nproc_per_node=emu.r.nproc_per_node,
        differences=emu.differences(),
        metrics=str(metrics_path),
        pod_events=[{"t": round(e.time - t0, 2), "what": e.what, "detail": e.detail} for e in emu.events],
        expected=(
            "nothing restarted"
            if members
            else ("the killed worker replaced alone, in its pod" if in_place else "the agents' worker-group restart")
            if workers
            else "the fenced pods replaced (Ignore)"
            if split
            else "the lost pod alone replaced, its ranks taken in place by a spare pod's workers"
            if losses
            else "only the failed pod replaced"
            if single
            else "JobSet gang restart"
        ),
        pods={
            job: {
                i: [
                    {**rec, "started": _rel(rec.get("started"), t0), "ended": _rel(rec.get("ended"), t0)}
                    for rec in recs
                ]
                for i, recs in by.items()
            }
            for job, by in pods.items()
        },
        pods_created={f"{job}/{i}": len(recs) for job, by in pods.items() for i, recs in by.items()},
        # every node pod's worker pids before each kill-worker fault and once the job recovered
        worker_kills=[
            {**k.facts(), "noticed_s": None if k.noticed is None else round(k.noticed - k.entry["time"], 3)}
            for k in kills
        ],
        # in place: every node pod's worker pids before a lost pod's kill (spare pods waiting) and after the recovery
        pod_losses=[loss.facts() for loss in losses],
    )
    return rep


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 2)


def header(rep: dict[str, Any]) -> str:
    """The Kubernetes line above the common table: TrainJob state, JobSet restarts, shape."""
    return (
        f"=== {rep.get('title', 'Kubernetes chaos report')} ===\n"
        f"TrainJob {rep.get('trainjob')}: {rep.get('state')}"
        + (f" ({rep['message']})" if rep.get("message") else "")
        + f" | JobSet restarts {rep.get('jobset_restarts')} (maxRestarts {rep.get('max_restarts')})"
        + (f" | pod failures {rep['pod_failures']}" if rep.get("pod_failures") is not None else "")
        + (f" | {rep['nodes']} node(s) x {rep['nproc_per_node']} proc" if rep.get("nodes") else "")
        + (
            "\npods per index (started): " + ", ".join(f"{k} {n}" for k, n in rep["pods_created"].items())
            if rep.get("pods_created")
            else ""
        )
    )


def format_report(rep: dict[str, Any]) -> str:
    """Header, the common table (one row for the run's faults), the checks, and the emulator's differences."""
    from training.goodput.analysis import Recovery
    from chaos.report import table

    res = ScenarioResult(**{k: rep[k] for k in ScenarioResult.__dataclass_fields__ if k in rep})
    res.recoveries = [Recovery(**r) if isinstance(r, dict) else r for r in res.recoveries]
    res.checks = [Check(**c) if isinstance(c, dict) else c for c in res.checks]
    lines = [header(rep), table([res], columns=("JobSet restarts", "pod failures"))]
    for r in res.recoveries:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(
            f"  {r.kind}: detect {fmt(r.detect_s)} s, recover {fmt(r.recover_s)} s, {r.steps_lost} step(s) recomputed"
        )
    lines += [f"  {'ok' if c.ok else 'NO'} {c.name}: {c.detail}" for c in res.checks]
    lines.append(
        "detect: fault -> Job failed, pod replaced by the Job controller, an agent's line (a worker killed in its pod) "
        "or (split brain) the spares' newer round; "
        "recover: fault -> first step of the resumed attempt; lost: steps recomputed"
    )
    lines += [f"  emulated: {d}" for d in rep.get("differences") or []]
    return "\n".join(lines)

"""Chaos test on a live EKS cluster: break a running TrainJob and prove nothing is lost.

    python -m chaos.eks [--nodes 2] [--preset t5-base] [--steps 600] [--interval 25]
                                       [--drain-node] [submit options] [-- training args]

1. Submits a TrainJob (the same one ``make train PLATFORM=eks`` builds) and starts a small reader pod that
   mounts the FSx volume read-only, to read the job's metrics JSONL while it runs.
2. Faults, each once the job is past the previous recovery by ``--gap`` steps:
   a. delete the pod of a node that is not node 0 (``kubectl delete pod``: SIGTERM, grace period);
   b. delete node 0's pod (the rendezvous host);
   c. with ``--drain-node``: drain the GPU node hosting node 1 (cordon + evict; needs a spare GPU node,
      i.e. the node group has more nodes than the job uses); it is uncordoned at the end.
   After each: the JobSet restart counter must go up, and a new attempt must log steps.
3. Waits for the TrainJob to complete, reads the metrics from FSx and checks step continuity (every step
   1..N logged, each attempt consecutive from its resume point), steps lost per fault (<= the checkpoint
   interval), and completion; prints the same table as the contract emulator and writes JSON.

Exit: 0 every check passed, 1 a check failed (the report says which), 2 no usable cluster/bad arguments.
Costs GPU time: the TrainJob is deleted at the end unless --keep (its files stay on FSx).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos import k8s_report as report
from tools.k8s.cluster import ClusterError, connect
from tools.k8s.submit import (PLACEHOLDER_IMAGE, apply_output_defaults, build_parser, check_training_args, condition,
                                       config_from_args, default_name, preflight, split_at_dashes,
                                       split_training_args)
from cluster_assets.k8s.trainjob import TrainJobError, train_job_manifest


def chaos_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "python -m chaos.eks"
    p.description = __doc__.split("\n\n")[0]
    p.epilog = "\n\n".join(__doc__.split("\n\n")[1:])
    g = p.add_argument_group("chaos")
    g.add_argument("--steps", type=int, default=600, help="train.steps of the chaos job (default 600)")
    g.add_argument("--interval", type=int, default=25, help="checkpoint.interval (default 25)")
    g.add_argument("--gap", type=int, default=0, help="steps between a recovery and the next fault (default 3x interval)")
    g.add_argument("--drain-node", action="store_true", help="also drain a GPU node (needs a spare GPU node)")
    g.add_argument("--keep", action="store_true", help="keep the TrainJob at the end (default: delete it)")
    g.add_argument("--report", default="reports/chaos-eks.json", help="report JSON path (default %(default)s)")
    g.add_argument("--phase-timeout", type=float, default=1800, help="max seconds to wait for one phase")
    return p


class Run:
    """One chaos run against a live TrainJob."""

    def __init__(self, cluster, cfg, claim: str, poll_s: float, phase_timeout: float):
        self.c, self.cfg, self.claim, self.poll_s, self.phase_timeout = cluster, cfg, claim, poll_s, phase_timeout
        self.reader = f"{cfg.name}-fsx-reader"[:63]
        self.metrics_path = f"{cfg.job_dir}/metrics.jsonl"
        self.faults: list[dict[str, Any]] = []
        self.cordoned: list[str] = []

    def log(self, msg: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def events(self) -> list[dict[str, Any]]:
        return report.parse_events(self.c.exec_read(self.cfg.namespace, self.reader, self.metrics_path))

    def last_step(self) -> int:
        return max((e["step"] for e in self.events() if e["event"] == "step"), default=0)

    def restarts(self) -> int:
        js = self.c.get_jobset(self.cfg.namespace, self.cfg.name) or {}
        return (js.get("status") or {}).get("restarts", 0) or 0

    def state(self) -> str | None:
        tj = self.c.get_train_job(self.cfg.namespace, self.cfg.name)
        if condition(tj, "Failed"):
            c = condition(tj, "Failed")
            raise ClusterError(f"TrainJob failed: {c.get('reason')} {c.get('message')}")
        return "Complete" if condition(tj, "Complete") else None

    def wait_for(self, what: str, pred) -> Any:
        deadline = time.time() + self.phase_timeout
        while time.time() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(self.poll_s)
        raise ClusterError(f"timed out after {self.phase_timeout:.0f} s waiting for {what}")

    def wait_step(self, step: int) -> int:
        self.log(f"waiting for step {step}")
        return self.wait_for(f"step {step}", lambda: (s if (s := self.last_step()) >= step else 0)
                             if not self.state() else -1)

    def inject(self, label: str, action) -> dict[str, Any]:
        before = self.restarts()
        step = self.last_step()
        t = time.time()
        detail = action()
        self.log(f"FAULT {label}: {detail} (at step {step}, JobSet restarts {before})")
        f = {"label": label, "time": t, "step": step, "detail": detail}
        self.wait_for("the JobSet restart", lambda: self.restarts() > before)
        f["detect_s"] = round(time.time() - t, 1)  # resolution: the poll interval
        f["pods_recreated_s"] = self.recreated_after(t, before)
        self.log(f"JobSet restart #{self.restarts()} seen after {f['detect_s']} s; waiting for training to resume")

        def resumed():
            starts = [e for e in self.events() if e["event"] == "start" and e["time"] > t]
            return starts and any(e["event"] == "step" and e["time"] > starts[0]["time"] for e in self.events())
        self.wait_for("the first step after the restart", resumed)
        if f["pods_recreated_s"] is None:
            f["pods_recreated_s"] = self.recreated_after(t, before)
        self.log(f"{label}: training resumed")
        self.faults.append(f)
        return f

    def recreated_after(self, t: float, attempt_before: int) -> float | None:
        """Seconds from the fault to the creation of the restarted gang's first pod (API server clock)."""
        from tools.k8s.cluster import pod_attempt
        new = [p.metadata.creation_timestamp.timestamp() for p in self.c.pods(self.cfg.namespace, self.cfg.name)
               if pod_attempt(p) > attempt_before and p.metadata.creation_timestamp]
        return round(min(new) - t, 1) if new else None

    def delete_pod(self, rank: int) -> str:
        pod = self.wait_for(f"a running pod of node {rank}", lambda: (p := self.c.node_pod(
            self.cfg.namespace, self.cfg.name, rank)) and p.status.phase == "Running" and p)
        self.c.delete_pod(self.cfg.namespace, pod.metadata.name)
        return f"deleted pod {pod.metadata.name} on {pod.spec.node_name}"

    def drain(self, rank: int) -> str:
        pod = self.c.node_pod(self.cfg.namespace, self.cfg.name, rank)
        node = pod.spec.node_name
        self.cordoned.append(node)
        evicted = self.c.drain(node)
        return f"drained node {node} (evicted {len(evicted)} pod(s))"

    def spare_gpu_nodes(self) -> int:
        nodes = self.c.core.list_node(_request_timeout=30).items
        gpu = [n for n in nodes if int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0
               and not n.spec.unschedulable]
        return len(gpu) - self.cfg.num_nodes

    def cleanup(self, keep: bool) -> None:
        for node in self.cordoned:
            try:
                self.c.cordon(node, unschedulable=False)
                self.log(f"uncordoned {node}")
            except ClusterError as e:
                self.log(f"could not uncordon {node}: {e} (run `kubectl uncordon {node}`)")
        try:
            self.c.delete_pod(self.cfg.namespace, self.reader, grace_s=0)
        except ClusterError:
            pass
        if not keep:
            try:
                self.c.delete_train_job(self.cfg.namespace, self.cfg.name)
                self.log(f"deleted TrainJob {self.cfg.name} (files stay in {self.cfg.job_dir})")
            except ClusterError:
                pass


def verdicts(rep: dict[str, Any], expected_faults: int, interval: int) -> list[str]:
    """Failed checks (empty = pass)."""
    bad = []
    if not rep["completed"]:
        bad.append("the job did not complete")
    if not rep["continuity_ok"]:
        bad.append(f"step continuity broken: missing {rep['missing_steps'][:10]} {rep['continuity_problems']}")
    if len(rep["faults"]) != expected_faults:
        bad.append(f"{len(rep['faults'])} of {expected_faults} faults injected (job too short? raise --steps)")
    for f in rep["faults"]:
        if f.get("recover_s") is None:
            bad.append(f"{f['label']}: no recovery seen")
        elif f["steps_lost"] > interval:
            bad.append(f"{f['label']}: {f['steps_lost']} steps lost > checkpoint interval {interval}")
    if rep["jobset_restarts"] < expected_faults:
        bad.append(f"JobSet restarted {rep['jobset_restarts']} times for {expected_faults} faults")
    return bad


def main(argv: list[str] | None = None) -> int:
    argv, after = split_at_dashes(argv)
    parser = chaos_parser()
    a, unknown = parser.parse_known_args(argv)
    a.name = a.name or default_name("chaos")
    plan_only, a.dry_run = a.dry_run, False  # DRY_RUN=1: print the plan and the TrainJob, touch nothing
    try:
        apply_output_defaults(a, parser)
        targs = ["--train.steps", str(a.steps), "--checkpoint.interval", str(a.interval),
                 *split_training_args(unknown, after)]
        cfg = config_from_args(a, targs)
        check_training_args(cfg)
    except (TrainJobError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gap = a.gap or 3 * a.interval
    if plan_only:
        from cluster_assets.k8s.trainjob import to_yaml
        print(f"# chaos plan: submit {cfg.name}; at step {2 * a.interval + 1} delete the pod of node 1; {gap} steps "
              f"after it resumed delete node 0's pod" + ("; then drain the GPU node of node 1" if a.drain_node else "")
              + "; wait for completion; check continuity, steps lost <= checkpoint interval, completion")
        print(to_yaml(train_job_manifest(cfg)), end="")
        return 0
    run = None
    try:
        cluster = connect(a.context)
        runtime_image = preflight(cluster, a, cfg)
        if cfg.image == PLACEHOLDER_IMAGE:
            cfg = replace(cfg, image=runtime_image)
        rt = cluster.get_runtime(cfg.runtime_name)
        claim = next(v["persistentVolumeClaim"]["claimName"] for rj in rt["spec"]["template"]["spec"]["replicatedJobs"]
                     for v in rj["template"]["spec"]["template"]["spec"].get("volumes", [])
                     if "persistentVolumeClaim" in v)
        run = Run(cluster, cfg, claim, poll_s=max(1.0, min(a.poll, 5.0)), phase_timeout=a.phase_timeout)
        plan = [("delete pod of node 1", lambda: run.delete_pod(1)), ("delete pod of node 0", lambda: run.delete_pod(0))]
        if cfg.num_nodes < 2:
            print("error: the chaos test needs --nodes 2 or more (a pod that is not node 0)", file=sys.stderr)
            return 2
        if a.drain_node:
            if run.spare_gpu_nodes() < 1:
                print("error: --drain-node needs a spare GPU node (schedulable GPU nodes > --nodes): raise the node "
                      "group size (gpuNodes) or drop --drain-node", file=sys.stderr)
                return 2
            plan.append(("drain GPU node of node 1", lambda: run.drain(1)))
        cluster.create_train_job(train_job_manifest(cfg))
        run.log(f"created TrainJob {cfg.namespace}/{cfg.name} ({cfg.num_nodes} x {cfg.nproc_per_node}, {a.steps} "
                f"steps, checkpoint every {a.interval}); reader pod {run.reader}")
        cluster.start_reader(cfg.namespace, run.reader, cfg.image, claim, cfg.fsx_mount_path, near_jobset=cfg.name)
        t0 = time.time()
        next_step = 2 * a.interval + 1
        for label, action in plan:
            if run.wait_step(next_step) < 0:
                break  # finished early
            run.inject(label, action)
            next_step = run.last_step() + gap
        run.log("waiting for the TrainJob to complete")
        run.wait_for("completion", run.state)
        events = run.events()
        rep = report.analyze(events, run.faults, a.steps)
        rep.update(title="EKS chaos test (Kubeflow Trainer TrainJob on the fault-tolerant runtime)",
                   trainjob=cfg.name, state="Complete", jobset_restarts=run.restarts(),
                   max_restarts=(rt["spec"]["template"]["spec"].get("failurePolicy") or {}).get("maxRestarts"),
                   nodes=cfg.num_nodes, nproc_per_node=cfg.nproc_per_node, total_s=round(time.time() - t0, 1),
                   metrics=f"{cfg.job_dir}/metrics.jsonl (FSx)")
        bad = verdicts(rep, len(plan), a.interval)
        rep["verdict"] = "PASS" if not bad else "FAIL: " + "; ".join(bad)
        print(report.format_report(rep))
        print(f"verdict: {rep['verdict']}")
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(json.dumps(rep, indent=2))
        print(f"report: {a.report}")
        return 0 if not bad else 1
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if run is None else 1
    except KeyboardInterrupt:
        return 130
    finally:
        if run is not None:
            run.cleanup(a.keep)


if __name__ == "__main__":
    sys.exit(main())

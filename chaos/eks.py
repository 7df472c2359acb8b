"""Chaos test on a live EKS cluster: break a running TrainJob and prove nothing is lost.

    python -m chaos.eks [--nodes 2] [--preset t5-base] [--steps 600] [--interval 25]
                        [--reference-job NAME] [--drain-node] [submit options] [-- training args]

1. The reference: an uninterrupted TrainJob with the same arguments (``<name>-ref``, run first and to the end),
   or an earlier one named with ``--reference-job`` (its files on FSx are reused; same arguments required).
2. Submits the chaos TrainJob (the same one ``make train PLATFORM=eks`` builds) and starts a small reader pod
   that mounts the FSx volume read-only, to read the job's metrics JSONL while it runs.
3. Faults, each once the job is past the previous recovery by ``--gap`` steps (catalog names):
   node-kill: delete the pod of a node that is not node 0 (``kubectl delete pod``: SIGTERM, grace period);
   first-node-kill: delete node 0's pod;
   node-drain (with ``--drain-node``): drain the GPU node hosting node 1 (cordon + evict; needs a spare GPU
   node, i.e. the node group has more nodes than the job uses); it is uncordoned at the end.
   Evidence per fault: the pod is gone or replaced (new uid). Noticed: with the runtime's per-index retry
   (``backoffLimitPerIndex``) a new pod of that index appears while the JobSet restart counter stays put; with a
   runtime without it, the JobSet restart counter goes up.
4. Waits for the TrainJob to complete, reads both jobs' metrics from FSx and judges the run with the common
   chaos verdict (``chaos.verdict``): every fault confirmed, noticed and recovered from, only the faulted pods
   replaced (store and other pods keep their uids, no JobSet restart) or one gang restart per fault, as the
   installed runtime promises, steps recomputed per fault, completion, every sample used exactly once, final weights
   bitwise equal to the reference (compared by ``python -m training.compare`` inside the reader pod, on FSx), same
   losses. Prints the common table and writes JSON.

Exit: 0 every check passed, 1 a check failed (the report says which), 2 no usable cluster/bad arguments.
Costs GPU time (twice the job without --reference-job): TrainJobs are deleted at the end unless --keep (their
files stay on FSx). Weights: bitwise on CPU pods; on GPU pods within GPU_WEIGHT_ATOL by default, because two
uninterrupted GPU runs already differ by ~1e-7 (docs/failover.md, section 6); --atol sets it (0: bitwise).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chaos import kubernetes as k8s_verdict
from training.goodput.analysis import parse_records
from chaos.report import ScenarioResult, write_json
from chaos.scenario import Scenario
from chaos.scenario import table as scenario_table
from chaos.verdict import Fault, Observation, judge
from cluster_assets.k8s.trainjob import TrainJobConfig, TrainJobError, train_job_manifest
from tools.k8s.cluster import ClusterError, connect, pod_attempt, pod_rank, pod_start_problem
from tools.k8s.submit import (
    PLACEHOLDER_IMAGE,
    apply_output_defaults,
    build_parser,
    check_submit_options,
    check_training_args,
    condition,
    config_from_args,
    default_name,
    preflight,
    split_at_dashes,
    split_training_args,
)


#: Default weight tolerance of a chaos job on GPU pods: some CUDA kernels accumulate with atomics in a varying
#: order, so two uninterrupted runs already differ by up to ~1.2e-7 in a parameter (H100, measured; docs/failover.md
#: section 6). 1e-6 is ~10x that noise and far below what a lost or repeated step changes. CPU pods: 0 (bitwise).
GPU_WEIGHT_ATOL = 1e-6


def weight_tolerance(atol: float | None, gpus_per_node: int) -> float:
    """The weights' tolerance vs the reference: ``--atol`` when given, else bitwise (0) on CPU pods and
    :data:`GPU_WEIGHT_ATOL` on GPU pods. ValueError for a negative ``--atol``."""
    if atol is None:
        return GPU_WEIGHT_ATOL if gpus_per_node else 0.0
    if atol < 0:
        raise ValueError(f"--atol {atol:g}: use 0 (bitwise) or a positive tolerance, e.g. {GPU_WEIGHT_ATOL:g} on GPUs")
    return atol


def chaos_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "python -m chaos.eks"
    p.description = __doc__.split("\n\n")[0]
    p.epilog = "\n\n".join(__doc__.split("\n\n")[1:])
    g = p.add_argument_group("chaos")
    g.add_argument("--steps", type=int, default=600, help="train.steps of the chaos job (default 600)")
    g.add_argument("--interval", type=int, default=25, help="checkpoint.interval (default 25)")
    g.add_argument(
        "--gap", type=int, default=0, help="steps between a recovery and the next fault (default 3x interval)"
    )
    g.add_argument("--drain-node", action="store_true", help="also drain a GPU node (needs a spare GPU node)")
    g.add_argument(
        "--reference-job",
        default="",
        help="an earlier uninterrupted TrainJob with the same arguments whose FSx files to compare with "
        "(default: run <name>-ref first)",
    )
    g.add_argument(
        "--atol",
        type=float,
        default=None,
        help=f"weight tolerance vs the reference (default: 0, bitwise, on CPU pods; {GPU_WEIGHT_ATOL:g} on "
        f"GPU pods, whose uninterrupted runs already differ by ~1e-7; 0 = bitwise)",
    )
    g.add_argument("--keep", action="store_true", help="keep the TrainJobs at the end (default: delete them)")
    g.add_argument("--report", default="reports/chaos-eks.json", help="report JSON path (default %(default)s)")
    g.add_argument("--phase-timeout", type=float, default=1800, help="max seconds to wait for one phase")
    return p


class EksChaosRun:
    """One chaos run against a live TrainJob; ``faults`` collects what was done and its evidence."""

    def __init__(self, cluster, cfg, poll_s: float, phase_timeout: float):
        self.c, self.cfg, self.poll_s, self.phase_timeout = cluster, cfg, poll_s, phase_timeout
        self.reader = f"{cfg.name}-fsx-reader"[:63]
        self.faults: list[Fault] = []
        self.detections: list[float] = []
        self.cordoned: list[str] = []
        self.faulted: list[str] = []  # "node/<index>" per fault
        self.seen: dict[str, dict[str, list[dict[str, Any]]]] = {}  # job -> index -> pods seen, by uid
        self.last_uid = ""

    def log(self, msg: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def records(self, job_dir: str | None = None) -> list[dict[str, Any]]:
        path = f"{job_dir or self.cfg.job_dir}/metrics.jsonl"
        return parse_records(self.c.exec_read(self.cfg.namespace, self.reader, path))

    def last_step(self) -> int:
        return max((e["step"] for e in self.records() if e["event"] == "step"), default=0)

    def restarts(self) -> int:
        js = self.c.get_jobset(self.cfg.namespace, self.cfg.name) or {}
        return (js.get("status") or {}).get("restarts", 0) or 0

    def state(self, name: str | None = None) -> str | None:
        tj = self.c.get_train_job(self.cfg.namespace, name or self.cfg.name)
        if condition(tj, "Failed"):
            c = condition(tj, "Failed")
            raise ClusterError(f"TrainJob {name or self.cfg.name} failed: {c.get('reason')} {c.get('message')}")
        if condition(tj, "Complete"):
            return "Complete"
        # a pod of the job (the store's too) that cannot start ends the wait now, not after --phase-timeout
        for p in self.c.pods(self.cfg.namespace, name or self.cfg.name, None):
            problem = pod_start_problem(p, self.cfg.namespace, name or self.cfg.name)
            if problem and problem.fatal:
                raise ClusterError(problem.line)
        return None

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
        return self.wait_for(
            f"step {step}", lambda: (s if (s := self.last_step()) >= step else 0) if not self.state() else -1
        )

    def observe(self) -> None:
        """Record the uids of the node pods now (a pod replaced and gone between two looks is missed)."""
        for job in ("node",):
            for p in self.c.pods(self.cfg.namespace, self.cfg.name, job):
                recs = self.seen.setdefault(job, {}).setdefault(str(pod_rank(p)), [])
                if p.metadata.uid not in [r["uid"] for r in recs]:
                    recs.append({"uid": p.metadata.uid, "name": p.metadata.name, "attempt": pod_attempt(p)})

    def replaced(self, rank: int, uid: str) -> bool:
        p = self.c.node_pod(self.cfg.namespace, self.cfg.name, rank)
        return bool(p) and p.metadata.uid != uid

    def inject(self, label: str, rank: int, action, gang: bool) -> None:
        """Do ``action`` (returns (detail, confirmed, evidence)) on node ``rank``'s pod; wait until the platform
        reacts (a replacement pod for that index, or a JobSet restart when ``gang``) and training resumes."""
        self.observe()
        before = self.restarts()
        step = self.last_step()
        t = time.time()
        detail, confirmed, evidence = action()
        uid = self.last_uid
        self.log(f"FAULT {label}: {detail} (at step {step}, JobSet restarts {before}); {evidence}")
        self.faults.append(Fault(label, t, confirmed, evidence))
        self.faulted.append(f"node/{rank}")
        if gang:
            self.wait_for("the JobSet restart", lambda: self.restarts() > before)
        else:
            self.wait_for(
                f"a new pod for node {rank} (or a JobSet restart)",
                lambda: self.restarts() > before or self.replaced(rank, uid),
            )
        self.detections.append(time.time())  # resolution: the poll interval
        self.observe()
        self.log(
            f"{'JobSet restart' if self.restarts() > before else f'replacement pod for node {rank}'} seen after "
            f"{self.detections[-1] - t:.1f} s (JobSet restarts {self.restarts()}); waiting for training"
        )

        def resumed():
            recs = self.records()
            starts = [e for e in recs if e["event"] == "start" and e["time"] > t]
            return starts and any(e["event"] == "step" and e["time"] > starts[0]["time"] for e in recs)

        self.wait_for("the first step after the restart", resumed)
        self.observe()
        self.log(f"{label}: training resumed")

    def delete_pod(self, rank: int) -> tuple[str, bool, str]:
        pod = self.wait_for(
            f"a running pod of node {rank}",
            lambda: (
                (p := self.c.node_pod(self.cfg.namespace, self.cfg.name, rank)) and p.status.phase == "Running" and p
            ),
        )
        uid = self.last_uid = pod.metadata.uid
        self.c.delete_pod(self.cfg.namespace, pod.metadata.name)

        def gone():
            now = self.c.node_pod(self.cfg.namespace, self.cfg.name, rank)
            return now is None or now.metadata.uid != uid or now.metadata.deletion_timestamp is not None

        ok = bool(self.wait_for(f"pod {pod.metadata.name} to go", gone))
        return f"deleted pod {pod.metadata.name} on {pod.spec.node_name}", ok, f"pod uid {uid} terminating or replaced"

    def drain(self, rank: int) -> tuple[str, bool, str]:
        pod = self.c.node_pod(self.cfg.namespace, self.cfg.name, rank)
        self.last_uid = pod.metadata.uid
        node = pod.spec.node_name
        self.cordoned.append(node)
        evicted = self.c.drain(node)
        ok = any(pod.metadata.name in e for e in evicted)
        return f"drained node {node}", ok, f"evicted {len(evicted)} pod(s), node {rank}'s among them: {ok}"

    def spare_gpu_nodes(self) -> int:
        nodes = self.c.core.list_node(_request_timeout=30).items
        gpu = [
            n
            for n in nodes
            if int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0 and not n.spec.unschedulable
        ]
        return len(gpu) - self.cfg.num_nodes

    def compare(self, ref_dir: str, steps: int, atol: float) -> list[str] | None:
        """``python -m training.compare`` on FSx inside the reader pod (the training image has it)."""
        final = f"checkpoints/step_{steps:08d}"
        argv = ["python", "-m", "training.compare", f"{ref_dir}/{final}", f"{self.cfg.job_dir}/{final}"]
        if atol:
            argv += ["--atol", str(atol)]
        rc, out = self.c.exec_run(self.cfg.namespace, self.reader, argv)
        self.log(f"compare vs reference: exit {rc}\n{out.strip()[-1500:]}")
        if rc == 0:
            return []
        lines = [line for line in out.splitlines() if line.strip()]
        return lines[-10:] or [f"training.compare exited {rc}"]

    def cleanup(self, keep: bool, names: list[str]) -> None:
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
        for name in [] if keep else names:
            try:
                self.c.delete_train_job(self.cfg.namespace, name)
                self.log(f"deleted TrainJob {name} (its files stay on FSx)")
            except ClusterError:
                pass


# ------------------------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class EksScenario(Scenario):
    """An EKS scenario (:class:`chaos.scenario.Scenario`: ``inject(run, index)`` returns (detail, confirmed,
    evidence)), the training pod it hits (its node index) and whether it needs a spare GPU node."""

    index: int = 1
    needs_spare_node: bool = False


def scenarios(interval: int, gang: bool, atol: float = 0.0) -> dict[str, EksScenario]:
    """Every EKS scenario by name (``chaos.catalog.PLATFORMS["eks"]``), in the order one run injects them into its
    TrainJob. Every pod fault expects the same (:func:`chaos.kubernetes.expectation`; weights within ``atol`` of the
    reference when it is set) and what the installed runtime promises for a lost pod: a JobSet gang restart
    (``gang``) or only that pod replaced."""
    expect = k8s_verdict.expectation(interval)
    if atol:
        expect = replace(expect, outcome="close", atol=atol)
    checks = (k8s_verdict.check_jobset_restarts if gang else k8s_verdict.check_single_pod_replaced,)
    return scenario_table(
        "eks",
        [
            EksScenario("node-kill", EksChaosRun.delete_pod, expect, checks, title="delete the pod of node 1", index=1),
            EksScenario(
                "first-node-kill", EksChaosRun.delete_pod, expect, checks, title="delete node 0's pod", index=0
            ),
            EksScenario(
                "node-drain",
                EksChaosRun.drain,
                expect,
                checks,
                title="drain the GPU node of node 1",
                index=1,
                needs_spare_node=True,
            ),
        ],
    )


def chosen(table: dict[str, EksScenario], drain_node: bool) -> list[EksScenario]:
    """The faults this run injects, in order: node-drain (a spare GPU node needed) only with ``--drain-node``."""
    return [sc for sc in table.values() if drain_node or not sc.needs_spare_node]


# ------------------------------------------------------------------------------------------------ run
def main(argv: list[str] | None = None) -> int:
    argv, after = split_at_dashes(argv)
    parser = chaos_parser()
    a, unknown = parser.parse_known_args(argv)
    a.name = a.name or default_name("chaos")
    plan_only, a.dry_run = a.dry_run, False  # DRY_RUN=1: print the plan and the TrainJob, touch nothing
    try:
        cfg, shape = job_config(a, parser, unknown, after)
    except (TrainJobError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ref_cfg = replace(cfg, name=f"{cfg.name}-ref"[:63]) if not a.reference_job else None
    if plan_only:
        print_plan(a, cfg, ref_cfg, chosen(scenarios(shape[2], gang=False), a.drain_node))  # gang: checks only
        return 0
    return chaos_run(a, cfg, ref_cfg, shape)


def job_config(
    a: argparse.Namespace, parser: argparse.ArgumentParser, unknown: list[str], after: list[str]
) -> tuple[TrainJobConfig, tuple[int, int, int]]:
    """The chaos TrainJob (the one ``make train PLATFORM=eks`` builds, with ``--steps`` and ``--interval``) and the
    (steps, global batch, checkpoint interval) its training arguments resolve to. TrainJobError or ValueError for a
    bad setting."""
    apply_output_defaults(a, parser)
    check_submit_options(a, parser)
    targs = [
        "--train.steps",
        str(a.steps),
        "--checkpoint.interval",
        str(a.interval),
        *split_training_args(unknown, after),
    ]
    cfg = config_from_args(a, targs)
    check_training_args(cfg)
    a.atol = weight_tolerance(a.atol, cfg.gpus_per_node)
    return cfg, k8s_verdict.training_shape(["--preset", cfg.preset, *targs])


def print_plan(
    a: argparse.Namespace, cfg: TrainJobConfig, ref_cfg: TrainJobConfig | None, plan: list[EksScenario]
) -> None:
    """DRY_RUN: the run's plan in one line, then the chaos TrainJob's YAML."""
    from cluster_assets.k8s.trainjob import to_yaml

    ref = a.reference_job or f"{ref_cfg.name} (run first, uninterrupted)"
    gap = a.gap or 3 * a.interval

    def when(i: int) -> str:
        return f"at step {2 * a.interval + 1}" if i == 0 else f"{gap} steps after it resumed" if i == 1 else "then"

    faults = "; ".join(f"{when(i)} {sc.name} ({sc.title})" for i, sc in enumerate(plan))
    weights = (
        f"within {a.atol:g} (GPU pods)"
        if a.atol and cfg.gpus_per_node
        else f"within {a.atol:g}"
        if a.atol
        else "bitwise"
    )
    print(
        f"# chaos plan: reference {ref}; submit {cfg.name}; {faults}; wait for completion; judge: faults confirmed "
        f"+ noticed + recovered, steps recomputed, completion, exactly-once data, weights vs the reference "
        f"{weights}"
    )
    print(to_yaml(train_job_manifest(cfg)), end="")


def chaos_run(
    a: argparse.Namespace, cfg: TrainJobConfig, ref_cfg: TrainJobConfig | None, shape: tuple[int, int, int]
) -> int:
    """Reference, chaos TrainJob, faults, verdict, report (module docstring); the exit code. Whatever happens, the
    nodes drained are uncordoned and, unless ``--keep``, the TrainJobs created are deleted."""
    run = None
    created: list[str] = []
    try:
        cluster = connect(a.context)
        cfg, rt = ready(cluster, a, cfg)
        claim = fsx_claim(rt)
        if cfg.num_nodes < 2:
            print("error: the chaos test needs --nodes 2 or more (a pod that is not node 0)", file=sys.stderr)
            return 2
        run = EksChaosRun(cluster, cfg, poll_s=max(1.0, min(a.poll, 5.0)), phase_timeout=a.phase_timeout)
        # what the installed runtime promises for a lost training pod: replaced alone, or a gang restart
        gang = k8s_verdict.runtime_retries_per_index(rt) < 1
        plan = chosen(scenarios(shape[2], gang, a.atol), a.drain_node)
        if any(sc.needs_spare_node for sc in plan) and run.spare_gpu_nodes() < 1:
            print(
                "error: --drain-node needs a spare GPU node (schedulable GPU nodes > --nodes): raise the node "
                "group size (gpuNodes) or drop --drain-node",
                file=sys.stderr,
            )
            return 2
        cluster.start_reader(cfg.namespace, run.reader, cfg.image, claim, cfg.fsx_mount_path)
        ref_dir = reference(run, a, ref_cfg, created)
        cluster.create_train_job(train_job_manifest(cfg))
        created.append(cfg.name)
        run.log(
            f"created TrainJob {cfg.namespace}/{cfg.name} ({cfg.num_nodes} x {cfg.nproc_per_node}, {a.steps} "
            f"steps, checkpoint every {a.interval}); reader pod {run.reader}"
        )
        t0 = time.time()
        inject_plan(run, plan, first_step=2 * a.interval + 1, gap=a.gap or 3 * a.interval, gang=gang)
        run.log("waiting for the TrainJob to complete")
        run.wait_for("completion", run.state)
        res = verdict(run, plan, shape, ref_dir, a.atol, t0)
        report(a, run, res, rt, gang, shape, ref_dir)
        return 0 if res.passed else 1
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if run is None else 1
    except KeyboardInterrupt:
        return 130
    finally:
        if run is not None:
            run.cleanup(a.keep, created)


def ready(cluster, a: argparse.Namespace, cfg: TrainJobConfig) -> tuple[TrainJobConfig, dict[str, Any]]:
    """The submit's checks of the cluster (``tools.k8s.submit.preflight``); the TrainJob with the runtime's image
    when none was given, and the installed runtime."""
    runtime_image = preflight(cluster, a, cfg)
    if cfg.image == PLACEHOLDER_IMAGE:
        cfg = replace(cfg, image=runtime_image)
    return cfg, cluster.get_runtime(cfg.runtime_name)


def fsx_claim(runtime: dict[str, Any]) -> str:
    """The claim of the FSx volume the runtime's pods mount (the reader pod mounts it too)."""
    return next(
        v["persistentVolumeClaim"]["claimName"]
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for v in rj["template"]["spec"]["template"]["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    )


def reference(run: EksChaosRun, a: argparse.Namespace, ref_cfg: TrainJobConfig | None, created: list[str]) -> str:
    """The reference job's directory on FSx: ``<name>-ref`` run here to completion, or ``--reference-job``'s."""
    cfg = run.cfg
    if ref_cfg is None:
        return f"{cfg.job_dir.rsplit('/', 1)[0]}/{a.reference_job}"
    ref_cfg = replace(ref_cfg, image=cfg.image)
    run.c.create_train_job(train_job_manifest(ref_cfg))
    created.append(ref_cfg.name)
    run.log(f"reference: TrainJob {ref_cfg.name}, uninterrupted; waiting for it to complete")
    run.wait_for("the reference TrainJob to complete", lambda: run.state(ref_cfg.name))
    return ref_cfg.job_dir


def inject_plan(run: EksChaosRun, plan: list[EksScenario], first_step: int, gap: int, gang: bool) -> None:
    """The plan's faults in order: the first once the job logged ``first_step``, each next one ``gap`` steps after
    training resumed from the previous; stops early when the job completes first."""
    next_step = first_step
    for sc in plan:
        if run.wait_step(next_step) < 0:
            break  # finished early
        run.inject(sc.name, sc.index, lambda sc=sc: sc.inject(run, sc.index), gang)
        next_step = run.last_step() + gap


def verdict(
    run: EksChaosRun, plan: list[EksScenario], shape: tuple[int, int, int], ref_dir: str, atol: float, t0: float
) -> ScenarioResult:
    """The completed run, judged once for all its faults (one TrainJob takes them all): by the expectation every
    pod fault shares and the checks of the faults injected."""
    steps, global_batch, _ = shape
    cfg, cluster = run.cfg, run.c
    final = f"{cfg.job_dir}/checkpoints/step_{steps:08d}/COMMITTED.json"
    obs = Observation(
        records=run.records(),
        faults=run.faults,
        detections=run.detections,
        exited_ok=True,
        exit_detail="TrainJob Complete",
        steps=steps,
        global_batch=global_batch,
        final_committed=bool(cluster.exec_read(cfg.namespace, run.reader, final)),
        weight_diffs=run.compare(ref_dir, steps, atol),
        reference_records=run.records(ref_dir),
        wall_s=time.time() - t0,
        facts={"jobset_restarts": run.restarts(), "pods": run.seen, "faulted": sorted(set(run.faulted))},
    )
    injected = plan[: len(run.faults)]
    res = ScenarioResult(
        name=",".join(sc.name for sc in injected),
        title="pod faults on EKS",
        t0=t0,
        events=[{"time": f.time, "kind": "fault", "label": f.label} for f in run.faults],
        figures={"JobSet restarts": run.restarts()},
        workdir=cfg.job_dir,
    )
    checks = list(dict.fromkeys(c for sc in plan for c in sc.checks))
    res.apply(judge(obs, plan[0].expect, checks))
    res.wall_s = obs.wall_s
    return res


def report(
    a: argparse.Namespace,
    run: EksChaosRun,
    res: ScenarioResult,
    rt: dict[str, Any],
    gang: bool,
    shape: tuple[int, int, int],
    ref_dir: str,
) -> None:
    """Print the Kubernetes report and the verdict; write the JSON report (``--report``)."""
    cfg = run.cfg
    steps, _, interval = shape
    rep = {
        **res.to_json(),
        "title": "EKS chaos test (Kubeflow Trainer TrainJob on the fault-tolerant runtime)",
        "trainjob": cfg.name,
        "state": "Complete",
        "jobset_restarts": run.restarts(),
        "max_restarts": (rt["spec"]["template"]["spec"].get("failurePolicy") or {}).get("maxRestarts"),
        "nodes": cfg.num_nodes,
        "nproc_per_node": cfg.nproc_per_node,
        "reference": ref_dir,
        "expected": "JobSet gang restart" if gang else "only the failed pod replaced",
        "pods": run.seen,
        "pods_created": {f"{j}/{i}": len(r) for j, by in run.seen.items() for i, r in by.items()},
    }
    print(k8s_verdict.format_report(rep))
    print(f"verdict: {'PASS' if res.passed else 'FAIL'}")
    Path(a.report).parent.mkdir(parents=True, exist_ok=True)
    write_json(
        Path(a.report),
        "eks",
        {"trainjob": cfg.name, "steps": steps, "interval": interval, "nodes": cfg.num_nodes},
        [res],
        {"job_dir": ref_dir},
        [],
        None,
    )
    print(f"report: {a.report}")


if __name__ == "__main__":
    sys.exit(main())

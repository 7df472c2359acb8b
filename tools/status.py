"""``make status [PLATFORM=...]``: one screen for the running or last training job.

    python -m tools.status [--platform local] [RUN_DIR | -- TRAINING_ARGS]   # default: the run make train uses
    python -m tools.status --platform slurm [--shared-dir DIR] [--run-name NAME]
    python -m tools.status --platform eks [--namespace NS] --name TRAINJOB

The screen: whether it runs, step / total, ETA, tokens/s, world size and spares, the last failure and what it
cost (phase by phase), goodput so far. The figures come from the run's ``metrics.jsonl`` through the goodput
ledger (:mod:`training.goodput.ledger`); what runs comes from the platform: locally the run's checkpoint
directory lock (held by the job's rank 0), on Slurm ``squeue`` (the job named after the run, its node count and
the run directory on the shared file system), on EKS the TrainJob's status and its pods (the metrics read from
FSx through the rank-0 pod). Exit 0 with the screen; 2 with one line when there is no such run or job. Lines of
the metrics that are not records (a damaged file) are left out of the figures, with one warning line on stderr.
It draws no picture: ``python -m training.goodput RUN_DIR`` writes the timeline PNG.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from cluster_facts import FSX_MOUNT_PATH, TRAINING_NAMESPACE
from training.checkpoint.run_lock import CheckpointDirBusy, RunLock
from training.goodput.analysis import scan_records
from training.goodput.ledger import (
    PHASES,
    Ledger,
    LedgerError,
    ledger_from_records,
    locate_run,
    read_ledger,
    skipped_warning,
    startup_line,
)
from training.job.metrics import WARMUP_STEPS

RECENT = 20  # steps the speed and the ETA are taken over (the training log's ETA takes the same median)


class StatusError(RuntimeError):
    """No run or job to show (the message says which and what to run)."""


@dataclass
class Where:
    """What the platform says about the job.

    Attributes:
        label: the job, in words (its run directory, Slurm job id, TrainJob name).
        running: True while it runs, False when it does not, None when the platform cannot tell.
        state: the platform's word for it (RUNNING, PENDING, Succeeded, ...), or ``""``.
        spares: hot-spare nodes the job has now (None: unknown on this platform).
        lines: extra platform lines (allocated nodes, pods).
    """

    label: str
    running: bool | None
    state: str = ""
    spares: int | None = None
    lines: list[str] = field(default_factory=list)


def _ago(t: float, now: float) -> str:
    return _duration(now - t) + " ago"


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


@dataclass
class Speed:
    """The newest attempt's pace over its last RECENT steps (its first step left out: warm-up), medians.

    Attributes:
        step_s: a step's compute time (``step_time_s``).
        pace_s: the wall time between step records (compute plus checkpoint stalls and anything between steps):
            what the ETA is taken at.
        tokens_per_s: the steps' tokens/s.
    """

    step_s: float
    pace_s: float | None
    tokens_per_s: float


def current_speed(ledger: Ledger) -> Speed | None:
    """The pace of the newest attempt (None before it has a step past its first)."""
    recs = [r for r in ledger.records if r.get("event") in ("start", "step")]
    last_start = max((i for i, r in enumerate(recs) if r["event"] == "start"), default=-1)
    # the job's step records carry both figures; a hand-made one without them has no pace to take
    steps = [r for r in recs[last_start + 1 :] if r["event"] == "step" and "step_time_s" in r and "tokens_per_s" in r][
        WARMUP_STEPS - 1 :
    ]
    if len(steps) < 2:
        return None
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:])][-RECENT:]
    steps = steps[1:][-RECENT:]
    return Speed(
        step_s=statistics.median(r["step_time_s"] for r in steps),
        pace_s=statistics.median(gaps),
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in steps),
    )


def screen(ledger: Ledger, where: Where, now: float | None = None) -> str:
    """The status screen (plain text, one fact per line)."""
    now = time.time() if now is None else now
    state = {
        True: "running",
        False: f"not running ({ledger.status})" if ledger.status != "finished" else "finished",
        None: ledger.status,
    }[where.running]
    if where.state:
        state += f" [{where.state}]"
    total = ledger.total_steps
    lines = [f"job      {where.label}: {state}"]
    pct = f" ({ledger.step / total:.0%})" if total else ""
    speed = current_speed(ledger)
    last = ledger.records[-1]
    running = where.running is not False and ledger.step != total
    eta = speed.pace_s * (total - ledger.step) if speed and total and running else None
    lines.append(
        f"step     {ledger.step}/{total or '?'}{pct}  ETA {'-' if eta is None else _duration(eta)}  "
        f"(last record {_ago(last['time'], now)})"
    )
    loss = next((r.get("loss") for r in reversed(ledger.records) if r.get("event") == "step"), None)
    lines.append(
        "speed    "
        + (
            f"{speed.tokens_per_s:,.0f} tokens/s, {speed.pace_s:.2f} s/step ({speed.step_s:.2f} s "
            f"computing; medians of the last {RECENT} steps)"
            if speed
            else "- (no step of this attempt after its first yet)"
        )
        + (f"; loss {loss:.4f}" if loss is not None else "")
    )
    world = next((r.get("world_size") for r in reversed(ledger.records) if r.get("event") in ("step", "start")), None)
    spares = "-" if where.spares is None else str(where.spares)
    lines.append(
        f"world    {world or '?'} ranks, {spares} spare node(s); {ledger.attempts} attempt(s) "
        f"({'>'.join(map(str, ledger.world_sizes)) or '-'})"
    )
    lines += [f"         {x}" for x in where.lines]
    snapshots = snapshot_line(ledger)
    if snapshots:
        lines.append(snapshots)
    if ledger.starts:
        newest = ledger.starts[-1]
        lines.append(f"start    attempt {newest.attempt}: {startup_line(newest)}")
    if ledger.failures:
        f = ledger.failures[-1]
        parts = ", ".join(
            f"{k.replace('_and_', '+').replace('_', ' ')} {v:.1f}" for k in PHASES if (v := f.phases.get(k)) is not None
        )
        lost = f.recovery.steps_lost
        cost = f"cost {f.cost_s:.1f} s ({parts})" if f.cost_s is not None else "not recovered yet"
        tier = f", restored from {f.recovery.tier}" if f.recovery.tier else ""
        lines.append(f"failure  last of {len(ledger.failures)}: {_ago(f.time, now)} after step {f.step}, {f.how[:70]}")
        lines.append(f"         {cost}; {'-' if lost is None else lost} step(s) recomputed{tier}")
    else:
        lines.append("failure  none")
    lines.append(
        f"goodput  {ledger.goodput:.0%} so far ({ledger.useful_s:,.0f} s useful of {ledger.wall_s:,.0f} s "
        f"wall); uninterrupted estimate {ledger.uninterrupted_goodput:.0%}; "
        f"{len(ledger.failures)} failure(s) cost {ledger.lost_s:,.1f} s"
    )
    lines.append(f"ledger   python -m training.goodput {ledger.run_dir}")
    return "\n".join(lines)


def snapshot_line(ledger: Ledger) -> str | None:
    """The newest attempt's in-memory snapshot interval (its step records) and, when the job measured it, what it
    costs against checkpoint.memory_budget (its newest ``snapshot_interval`` record); None for records that do not
    say (runs from before the interval was recorded)."""
    recs = ledger.records
    first = max((i for i, r in enumerate(recs) if r.get("event") == "start"), default=-1) + 1
    interval = next(
        (
            r["snapshot_interval"]
            for r in reversed(recs[first:])
            if r.get("event") == "step" and "snapshot_interval" in r
        ),
        None,
    )
    chosen = next((r for r in reversed(recs[first:]) if r.get("event") == "snapshot_interval"), None)
    if interval is None and chosen is None:
        return None
    if interval == 0:
        return "memory   in-memory snapshots off (restarts restore from storage)"
    n = chosen["interval"] if interval is None else interval
    line = f"memory   in-memory snapshot every {n} step(s): a failure costs at most {n} step(s)"
    if chosen is None or "share" not in chosen or "budget" not in chosen:
        return line
    cost = f"{100 * chosen['share']:.1f}% of training time blocked, budget {100 * chosen['budget']:g}%"
    if chosen.get("mode") == "fixed":  # a fixed memory_interval over the budget
        return (
            f"{line} (memory_interval={chosen['interval']}: {cost}; auto would take every "
            f"{chosen.get('auto_interval', '?')})"
        )
    return f"{line} (auto: {cost})"


# ------------------------------------------------------------------------------------------ local
def local(run_dir: str | None, train_args: list[str]) -> tuple[Ledger, Where]:
    """A run on this machine: its run directory; running while its checkpoint directory's lock is held."""
    run_dir, metrics = locate_run(run_dir, train_args)
    ledger = read_ledger(run_dir, metrics=metrics)
    try:
        ckpt = tomllib.loads((Path(run_dir) / "config.toml").read_text())["checkpoint"]["dir"]
    except (OSError, KeyError, TypeError, ValueError):  # ValueError: TOMLDecodeError, UnicodeDecodeError
        ckpt = None
    if not isinstance(ckpt, str) or not ckpt:  # a damaged config.toml: the job's default place
        ckpt = str(Path(run_dir) / "checkpoints")
    try:
        RunLock(ckpt).check()
        running = False
    except CheckpointDirBusy:
        running = True
    return ledger, Where(label=f"{run_dir} (local)", running=running)


# ------------------------------------------------------------------------------------------ slurm
def _sbatch_setting(run_dir: Path, name: str) -> int | None:
    try:
        m = re.search(rf"^{name}=(\d+)", (run_dir / "job.sbatch").read_text(), flags=re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def slurm(shared_dir: str | None, run_name: str) -> tuple[Ledger, Where]:
    """The newest Slurm job named ``run_name`` (squeue), else the last one's run directory on the shared file
    system (``<shared_dir>/runs/<run_name>``, as ``tools.slurm.submit`` lays it out)."""
    from tools.slurm import slurmctl
    from tools.slurm.submit import default_shared_dir

    env, lab = slurmctl.resolve_environment()
    try:
        out = slurmctl.run(
            ["squeue", "-h", "-t", "all", "-n", run_name, "-o", "%i|%T|%D|%N|%Z|%M"], env=env, timeout=30
        )
    except slurmctl.SlurmError as e:
        raise StatusError(str(e)) from None
    jobs = [line.split("|") for line in out.splitlines() if line.count("|") == 5]
    if jobs:
        job_id, state, nodes, nodelist, workdir, elapsed = max(jobs, key=lambda j: int(j[0].split("_")[0]))
        run_dir = Path(workdir)
    else:
        run_dir = Path(shared_dir or default_shared_dir(lab)) / "runs" / run_name
        job_id = state = nodes = nodelist = elapsed = ""
    ledger = read_ledger(run_dir)
    train_nodes, spares = _sbatch_setting(run_dir, "NODES"), _sbatch_setting(run_dir, "SPARES")
    if not jobs:
        return ledger, Where(
            label=f"{run_dir} (slurm: no job named {run_name} in squeue)", running=False, spares=spares
        )
    now_spares = None if train_nodes is None else max(0, int(nodes) - train_nodes)
    lines = [
        f"slurm job {job_id}: {nodes} node(s) allocated ({nodelist}), {train_nodes or '?'} training, "
        f"{spares if spares is not None else '?'} spare(s) submitted; elapsed {elapsed}"
    ]
    return ledger, Where(
        label=f"slurm job {job_id} ({run_dir})", running=state == "RUNNING", state=state, spares=now_spares, lines=lines
    )


# ------------------------------------------------------------------------------------------ eks
def eks(namespace: str, name: str, metrics_path: str | None) -> tuple[Ledger | None, Where]:
    """A TrainJob: its status (with the ``trainerStatus`` rank 0 reports) and pods; the metrics read through the
    rank-0 pod (FSx). No ledger (None) when no pod runs but the TrainJob's status has the progress."""
    from cluster_assets.k8s.trainjob import SPARES_ENV
    from tools.k8s import cluster as k8s

    try:
        c = k8s.connect()
        job = c.get_train_job(namespace, name)
        if job is None:
            raise StatusError(f"no TrainJob {namespace}/{name}: give --name (kubectl get trainjobs -n {namespace})")
        pods = c.pods(namespace, name)
    except k8s.ClusterError as e:
        raise StatusError(str(e)) from None
    status = job.get("status") or {}
    conds = [x for x in status.get("conditions", []) if x.get("status") == "True"]
    state = conds[-1]["type"] if conds else "Created"
    phases: dict[str, int] = {}
    for p in pods:
        phases[p.status.phase] = phases.get(p.status.phase, 0) + 1
    running_pods = [p for p in pods if p.status.phase == "Running"]
    trainer = (job.get("spec") or {}).get("trainer") or {}
    submitted = next((e.get("value") for e in trainer.get("env") or [] if e.get("name") == SPARES_ENV), "0")
    lines = [
        f"pods: {', '.join(f'{n} {ph}' for ph, n in sorted(phases.items())) or 'none'} "
        f"(numNodes {trainer.get('numNodes', '?')}, {submitted} spare(s) submitted)"
    ]
    if status.get("trainerStatus"):  # what rank 0 reported (training.job.trainer_status), as kubectl shows it
        ts = status["trainerStatus"]
        shown = ", ".join(f"{m['name']} {m['value']}" for m in ts.get("metrics", []) if m.get("name") != "last_failure")
        lines.append(
            f"trainerStatus: {ts.get('progressPercentage', '?')}%, "
            f"ETA {ts.get('estimatedRemainingSeconds', '?')} s; {shown} "
            f"(updated {ts.get('lastUpdatedTime', '?')})"
        )
    label = f"TrainJob {namespace}/{name}"
    path = metrics_path or f"{FSX_MOUNT_PATH}/jobs/{name}/metrics.jsonl"  # TrainJobConfig.job_dir
    text = ""
    rank0 = next((p for p in running_pods if k8s.pod_rank(p) == 0), running_pods[0] if running_pods else None)
    if rank0 is not None:
        try:
            text = c.exec_read(namespace, rank0.metadata.name, path, container="node")
        except k8s.ClusterError as e:
            raise StatusError(f"cannot read {path} through pod {rank0.metadata.name}: {e}") from None
    if not text:
        if len(lines) > 1:  # no pod to read the metrics through, but the TrainJob's own status says where it is
            return None, Where(label=label, running=False, state=state, lines=lines)
        raise StatusError(
            f"TrainJob {namespace}/{name} is {state} and no pod runs to read {path} from FSx "
            f"(its pods: {phases or 'none'})"
        )
    try:
        cfg = tomllib.loads(
            c.exec_read(namespace, rank0.metadata.name, str(Path(path).parent / "config.toml"), container="node")
        )
        total = int(cfg["train"]["steps"])
    except (k8s.ClusterError, KeyError, TypeError, ValueError, OverflowError):  # ValueError: TOMLDecodeError
        total = None
    records, skipped = scan_records(text)
    ledger = ledger_from_records(f"{namespace}/{name}:{path}", records, total, what=path, skipped=skipped)
    world = next((r.get("world_size") for r in reversed(ledger.records) if r.get("event") == "step"), None)
    nproc = trainer.get("numProcPerNode")
    nproc = int(nproc) if str(nproc).isdigit() and int(nproc) > 0 else None
    spares = None if world is None or nproc is None else max(0, len(running_pods) - world // nproc)
    return ledger, Where(
        label=label, running=bool(running_pods) and state != "Complete", state=state, spares=spares, lines=lines
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(
        prog="python -m tools.status",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--platform P] [options] [RUN_DIR | -- TRAINING_ARGS]",
    )
    p.add_argument(
        "--platform",
        default=os.environ.get("PLATFORM") or "local",
        choices=("local", "slurm", "parallelcluster", "eks"),
        help="where the job runs (default local)",
    )
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="local: the run's job.out_dir")
    p.add_argument(
        "--shared-dir",
        default=os.environ.get("SHARED_DIR"),
        help="slurm: the shared file system (default SHARED_DIR, /fsx when mounted, else the local lab's)",
    )
    p.add_argument(
        "--run-name",
        default=os.environ.get("RUN_NAME") or os.environ.get("PRESET") or "debug",
        help="slurm: the run's name (RUN_NAME, else the preset: the submit's default)",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("NAMESPACE") or TRAINING_NAMESPACE,
        help=f"eks: the TrainJob's namespace (NAMESPACE, else {TRAINING_NAMESPACE}: where make train submits)",
    )
    p.add_argument("--name", default=os.environ.get("JOB_NAME"), help="eks: the TrainJob's name")
    p.add_argument(
        "--metrics-path",
        help="eks: metrics.jsonl on FSx as the pods see it "
        "(default /fsx/jobs/NAME/metrics.jsonl, the submit's job directory)",
    )
    a = p.parse_args(argv)
    try:
        if a.platform == "local":
            if not (a.run_dir or train_args):  # the run make train starts with no arguments
                train_args = ["--preset", os.environ.get("PRESET") or "debug"]
            ledger, where = local(a.run_dir, train_args)
        elif a.platform in ("slurm", "parallelcluster"):
            ledger, where = slurm(a.shared_dir, a.run_name)
        else:
            if not a.name:
                raise StatusError("PLATFORM=eks needs the TrainJob's name: --name NAME (or JOB_NAME=NAME)")
            ledger, where = eks(a.namespace, a.name, a.metrics_path)
    except (LedgerError, StatusError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        screen(ledger, where)
        if ledger is not None
        else "\n".join(
            [f"job      {where.label}: {where.state} (no pod runs to read the metrics through)"]
            + [f"         {x}" for x in where.lines]
        )
    )
    if ledger is not None and (warning := skipped_warning(ledger)):
        print(warning, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos test on a real Slurm cluster (the local lab by default): ``make chaos-test PLATFORM=slurm``.

Runs the debug job on 2 nodes with checkpoints on the shared directory, once without faults (the reference,
cached by config and training code) and once per scenario (``--scenarios NAME,NAME``; default all):

{listing}

The job trains on 2 nodes with 1 hot spare (3 lab nodes); its agents keep their membership in the 3-member etcd the
lab runs on its host side, off every compute node, as the clusters run theirs (the batch script makes the job's own
etcd user with the lab's root credentials); the batch host starts as the spare. node-kill unplugs and kills a
training node outright, first-node-kill kills the node running rank 0: in both the job keeps its allocation
(--no-kill), the survivors and the spare re-form in seconds, no requeue; Slurm marks the node DOWN on its own and
the node is revived for the next scenario. network-cut takes a training node's link down instead (netns lab): its
processes keep running, silent, as in a partition; the other agents see its keep-alives stop within seconds and the
spare takes its place; the node is fenced (everything on it SIGKILLed) before it is revived. worker-kill kills only
the training processes on a node: torchrun restarts the worker group inside the allocation, no requeue.
worker-kill-in-place kills one training process of a failover.in_place job: its agent starts it again alone, every
other worker keeps its process and recovers in place (no restart, no requeue).
preemption sends SIGUSR1 to the batch script as Slurm's ``--signal=B:USR1@T`` does: the job checkpoints and
requeues itself. batch-host-kill kills the node that runs the batch script, which ends any allocation: Slurm
requeues the job and it resumes. store-member-kill SIGKILLs the etcd leader: the others elect a new one and training
goes on untouched. store-outage SIGKILLs every member and starts them again 20 s later: training goes on, the
agents say the store is unreachable and reconnect. store-outage-then-worker-kill also kills a node's training
processes while no member answers: the new round waits for the store and trains again within seconds of its return.
split-brain runs its job with a spare per training node (the lab gets that many more nodes) and SIGSTOPs the training
nodes' agents only: the spares form a second worker group, the commit fence stops the old one at its next commit, its
nodes leave the step (exit 0, so srun does not kill the newer group) and the job finishes without a requeue
(chaos.slurm_split_brain).

Each scenario is judged by ``chaos.verdict.judge`` (the same checks as on the other platforms: fault injected
and confirmed, noticed, restarted, steps recomputed, completed, exactly-once data, final weights bitwise equal
to the reference) plus its Slurm checks (requeue or not). Prints the common table and writes report.json and
timeline.png. Exit 0 when every scenario passed, 1 otherwise, 2 for a bad setting, 3 when the lab can't run.
Slurm's "detect" is the first of: an agent logs the failed worker group or the rendezvous re-forming, a
`[watchdog]` line (network-cut), the node is DOWN (node faults), the job logs the signal (preemption), etcd elected
a new leader (store-member-kill), or the agents log that the store does not answer (the outages).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from chaos import catalog, report
from chaos.grey import check_back_to_speed, check_straggler_named, check_wedge_declared
from chaos.local.scenarios import (
    check_blocked_survivors_cut_in_place,
    check_rank0_joined_in_place,
    check_recomputed_in_place,
    check_silent_node_replaced_in_place,
    check_straggler_left_in_place,
    check_survivors_kept_after_node_loss,
    check_survivors_kept_in_place,
)
from chaos.local.split_brain import check_stale_group_fenced
from chaos.slurm_split_brain import check_fenced_nodes_left, split_brain
from chaos.split_brain import HOLD_FILE
from training.goodput.analysis import parse_records, torchrun_detections
from chaos.report import ScenarioResult
from chaos.scenario import Scenario
from chaos.scenario import table as scenario_table
from chaos.verdict import Check, Expectation, Fault, Observation, compare_weights, judge
from cluster_assets.slurm.config import REPO_DIR, SlurmJobConfig
from cluster_assets.slurm.render import render
from tools.env_flags import EnvFlagError, env_count
from tools.slurm import slurmctl
from training.checkpoint import MARKER
from training.job.lifecycle import worker_rank

LAB_DIR = REPO_DIR / "testbed" / "slurm_lab"


def say(msg: str) -> None:
    print(f"[chaos-slurm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class SlurmChaosConfig:
    """Settings of one Slurm chaos run."""

    scenarios: str = "all"
    """Comma-separated scenario names to run, in order ("all": every scenario Slurm supports)."""
    nodes: int = 2
    """Training nodes per job."""
    spares: int = 1
    """Hot-spare nodes on top (the lab is brought up with nodes + spares); the node scenarios need one to
    continue inside the allocation."""
    preset: str = "debug"
    """Training preset."""
    steps: int = 12
    """Training steps per job: small, so that every scenario finishes in about a minute."""
    interval: int = 2
    """Checkpoint interval (steps); steps lost on a crash are at most this plus one save in flight."""
    fault_step: int = 5
    """Inject the fault once the job has logged this step."""
    train_args: tuple[str, ...] = ()
    """Extra training flags for every job (reference included)."""
    work_dir: str = str(REPO_DIR / ".chaos" / "slurm")
    """Shared directory for the jobs (every lab node sees this machine's file system) and the reports."""
    lab_root: str = str(REPO_DIR / ".slurm-lab")
    """Root of the lab (scripts/slurm_lab.sh); brought up if it is not, torn down at the end only then."""
    keep_lab: bool = False
    """Leave a lab this run started running at the end."""
    scenario_timeout_s: float = 420.0
    """Give up on a scenario after this long."""
    rdzv_port: int = 29400
    """Base port of a first-node store (+ job id % 1000; only if the lab's store does not answer)."""
    slow_percent: int = 33
    """``straggler``: the slow node's share of one CPU and of a node's CPU weight (``fault.sh slow``). 33 is the
    issue's "a third of its speed"; on a machine shared with other heavy work a lower share (the lab's e2e test
    uses 10) still names the straggler, where 25-33% may not bind at all (see ``slow_node``)."""

    @property
    def names(self) -> list[str]:
        return catalog.select("slurm", self.scenarios)

    @property
    def lab_nodes(self) -> int:
        """Lab nodes: the training nodes and the most hot spares a job of the selected scenarios runs with
        (split-brain's job has a spare per training node)."""
        table = scenarios(self)
        return self.nodes + max([self.spares, *(table[n].spares or 0 for n in self.names)])

    def validate(self) -> None:
        self.names  # noqa: B018 - raises UnknownScenario (a ValueError) naming the supported scenarios
        if self.nodes < 2:
            raise ValueError(f"--nodes {self.nodes}: node faults need at least 2 nodes")
        if not 0 <= self.spares <= 4:
            raise ValueError(f"--spares {self.spares}: use 0..4")
        needy = [s.name for s in scenarios(self).values() if s.needs_spare and s.spares is None]
        if self.spares < 1 and set(needy) & set(self.names):
            listed = " and ".join([", ".join(needy[:-1]), needy[-1]] if len(needy) > 1 else needy)
            raise ValueError(
                f"{listed} continue inside the allocation only with a hot spare: use --spares 1 (or pick "
                "other --scenarios)"
            )
        if not 1 <= self.slow_percent <= 90:
            raise ValueError(f"--slow-percent {self.slow_percent}: use 1..90 (the slow node's percent of one CPU)")
        if not 1 <= self.interval < self.fault_step < self.steps:
            raise ValueError(
                f"need 1 <= interval ({self.interval}) < fault step ({self.fault_step}) < steps "
                f"({self.steps}) so that a checkpoint exists before the fault and work remains after it"
            )

    @property
    def job_train_args(self) -> tuple[str, ...]:
        # 0.2 s per step keeps the re-formed job training long enough for the chaos run to see which nodes train
        # (a tiny step takes ~0.2 s on a 2-core machine: the steps after a recovery were over in ~2 s)
        return (
            "--train.steps",
            str(self.steps),
            "--train.warmup_steps",
            str(min(2, self.steps)),
            "--checkpoint.interval",
            str(self.interval),
            "--checkpoint.keep_last",
            "3",
            "--metrics.log_every",
            "1",
            "--fault.step_sleep_s",
            "0.2",
            *self.train_args,
        )


# ------------------------------------------------------------------------------------------- lab control
class Lab:
    """The lab's scripts, run with this run's SLAB_* environment."""

    def __init__(self, root: str, nodes: int):
        self.root = Path(root)
        self.env = dict(os.environ, SLAB_ROOT=str(self.root), SLAB_NODES=str(nodes))
        self.env.pop("SLURM_CONF", None)
        self.started_here = False

    def _run(self, script: str, *args: str, timeout: float = 180, check: bool = True) -> str:
        out = subprocess.run(
            [str(LAB_DIR / script), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and out.returncode != 0:
            raise RuntimeError(
                f"lab {script} {' '.join(args)} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-2000:]}"
            )
        return out.stdout

    def up(self) -> None:
        was_up = subprocess.run([str(LAB_DIR / "status.sh")], env=self.env, capture_output=True).returncode == 0
        t0 = time.monotonic()
        self._run("up.sh", timeout=600)
        self.started_here = not was_up
        say(
            f"lab {'already up' if was_up else f'up in {time.monotonic() - t0:.1f} s'} "
            f"({(self.root / 'run' / 'settings').read_text().strip()})"
        )
        self.env["SLURM_CONF"] = str(self.root / "etc" / "slurm.conf")

    def down(self) -> None:
        self._run("down.sh", check=False)

    @property
    def etcd_env(self) -> str:
        """Root's ``T5_ETCD_*`` of the etcd members the lab runs off its nodes (written by up.sh): jobs make their
        own etcd user with them."""
        path = self.root / "etcd" / "admin.env"
        if not path.is_file():
            raise RuntimeError(
                f"the lab at {self.root} runs no etcd ({path} is missing): restart it with "
                "scripts/slurm_lab.sh down && scripts/slurm_lab.sh up"
            )
        return str(path)

    def store(self, cmd: str) -> str:
        """``fault.sh store CMD``: the lab's etcd members (kill-leader, stop, start, leader, pids, health)."""
        return self._run("fault.sh", "store", cmd, timeout=60).strip()

    def store_async(self, cmd: str) -> subprocess.Popen:
        return self.fault_async("store", cmd)

    def fault(self, cmd: str, node: str, *args: str) -> str:
        return self._run("fault.sh", cmd, node, *args)

    def fault_async(self, cmd: str, node: str) -> subprocess.Popen:
        return subprocess.Popen(
            [str(LAB_DIR / "fault.sh"), cmd, node],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def pids(self, node: str) -> set[int]:
        return {int(p) for p in self.fault("pids", node).split()}

    def link_state(self, node: str) -> str:
        """The node's link as the lab host sees it: UP, DOWN (``none`` when the lab runs on loopback)."""
        return self.fault("link", node).strip()

    def worker_pids(self, node: str) -> set[int]:
        """Training worker processes on a node (named ``t5f-rank-N``, :func:`training.job.lifecycle.worker_rank`)."""
        return {p for p in self.pids(node) if worker_rank(p) is not None}

    def worker_ranks(self, hosts: list[str]) -> dict[str, list[int]]:
        """Ranks of the training workers on each of ``hosts`` (:meth:`workers_by_host`)."""
        return {
            h: sorted(r for r in (worker_rank(p) for p in pids) if r is not None)
            for h, pids in self.workers_by_host(hosts).items()
        }

    def workers_by_host(self, hosts: list[str]) -> dict[str, list[int]]:
        """The training workers' pids on each of ``hosts``. In netns mode from each worker's network namespace
        (one /proc scan, milliseconds: a tiny job trains a step in ~0.2 s, and the fault must land mid-run);
        otherwise through ``fault.sh pids`` per host."""
        prefix = slurmctl.Lab(self.root).setting("SLAB_PFX")
        if (
            (self.root / "run" / "mode").is_file()
            and (self.root / "run" / "mode").read_text().strip() == "netns"
            and prefix
        ):
            out: dict[str, list[int]] = {h: [] for h in hosts}
            for d in Path("/proc").iterdir():
                if not d.name.isdigit() or worker_rank(int(d.name)) is None:
                    continue
                ns = subprocess.run(["ip", "netns", "identify", d.name], capture_output=True, text=True).stdout
                node = ns.strip().removeprefix(f"{prefix}-")
                if node in out:
                    out[node].append(int(d.name))
            return {h: sorted(p) for h, p in out.items()}
        return {h: sorted(self.worker_pids(h)) for h in hosts}


# ------------------------------------------------------------------------------------------- job watching
class Tail:
    """New complete lines of a growing file, each stamped with the time it was seen."""

    def __init__(self, path: Path):
        self.path, self.pos, self.buf = path, 0, ""

    def read(self) -> list[tuple[float, str]]:
        if not self.path.is_file():
            return []
        with open(self.path, errors="replace") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        now = time.time()
        self.buf += data
        *lines, self.buf = self.buf.split("\n")
        return [(now, line) for line in lines]


@dataclass
class Seen:
    """What one scenario's job showed while it was followed: its metrics records and log lines, the fault, the
    times Slurm noticed it (node DOWN), the job's last state, and the harness's notes (``watch``: the node hit,
    when it went DOWN, its reviver, ...)."""

    jid: int
    metrics: Tail
    log: Tail
    run_dir: Path
    records: list[dict] = field(default_factory=list)
    logs: list[tuple[float, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    detections: list[float] = field(default_factory=list)
    watch: dict = field(default_factory=dict)
    info: slurmctl.JobInfo | None = None

    def read(self) -> None:
        """Take in the lines the job's metrics and log gained since the last read."""
        self.records += parse_records("\n".join(line for _, line in self.metrics.read()))
        self.logs += self.log.read()


# ------------------------------------------------------------------------------------------- faults
@dataclass(frozen=True)
class Target:
    """Where a Slurm fault lands: the scenario, the job, the node picked for it, that node's training ranks, the
    last step the job had logged, and the scenario's notes."""

    scenario: str
    job: slurmctl.JobInfo
    node: str
    ranks: list[int]
    last_step: int
    watch: dict = field(default_factory=dict)  # the scenario's notes (Seen.watch): what the fault did, when
    run_dir: Path = Path()  # the job's run directory (its job.out_dir: the fault hooks' markers)


# Which node a scenario's fault hits, from the job's hosts and the training ranks on each.
def last_host(hosts: list[str], ranks: dict[str, list[int]], job: slurmctl.JobInfo) -> str:
    """The last node: a training node (the batch host, the first, starts as the spare)."""
    return hosts[-1]


def rank0_host(hosts: list[str], ranks: dict[str, list[int]], job: slurmctl.JobInfo) -> str:
    """The node running rank 0."""
    return next((h for h in hosts if 0 in ranks[h]), hosts[-1])


def training_host_off_rank0(hosts: list[str], ranks: dict[str, list[int]], job: slurmctl.JobInfo) -> str:
    """The last node that trains (runs workers) without rank 0 and is not the batch host (the standby spare)."""
    return next((h for h in reversed(hosts) if ranks[h] and 0 not in ranks[h] and h != job.batch_host), hosts[-1])


def batch_host(hosts: list[str], ranks: dict[str, list[int]], job: slurmctl.JobInfo) -> str:
    """The node running the batch script."""
    return job.batch_host or hosts[0]


def kill_node(lab: Lab, t: Target) -> Fault:
    """Every process on the node SIGKILLed (the lab's power loss); confirmed when none is left."""
    start = time.time()
    lab.fault("kill-node", t.node)
    left = lab.pids(t.node)
    say(f"{t.scenario}: killed node {t.node} (ranks {t.ranks}; batch host {t.job.batch_host}) after step {t.last_step}")
    return Fault(
        f"kill node {t.node}",
        start,
        not left,
        f"no process left on {t.node}" if not left else f"{len(left)} processes survived on {t.node}",
    )


def kill_node_in_place(lab: Lab, t: Target) -> Fault:
    """:func:`kill_node` in a ``failover.in_place`` job with a spare: notes every job node's worker pids before the
    kill (:meth:`Runner.after_fault` notes them again once the job logged its in-place recovery) and the nodes
    that ran none (the spares, where the lost node's ranks must go), for
    :func:`chaos.local.scenarios.check_silent_node_replaced_in_place`: the lab's node kill also takes its link down,
    so a survivor's gloo collective with it blocks instead of failing, and its agent asks it to cut its group
    (:func:`chaos.local.scenarios.check_blocked_survivors_cut_in_place`): it keeps its process."""
    hosts = t.watch.get("hosts") or [t.node]
    before = lab.workers_by_host(hosts)
    fault = kill_node(lab, t)
    t.watch["in_place_pending"] = True
    spares = [h for h, pids in before.items() if not pids and h != t.node]
    loss = {"pids": before.get(t.node, []), "node": t.node, "new_nodes": spares, "before": before, "after": {}}
    t.watch["facts"] = {**t.watch.get("facts", {}), "in_place_kill": loss, "memory_interval": 1}
    return fault


def cut_link(lab: Lab, t: Target) -> Fault:
    """The node's link taken down; confirmed when the link is DOWN and its training workers still run, cut off."""
    before = lab.worker_pids(t.node)
    start = time.time()
    lab.fault("cut-link", t.node)
    link = lab.link_state(t.node)
    alive = before & lab.worker_pids(t.node)
    say(
        f"{t.scenario}: cut the link of {t.node} after step {t.last_step} (link {link}, workers alive: {sorted(alive)})"
    )
    return Fault(
        f"cut link of {t.node}",
        start,
        link == "DOWN" and bool(alive),
        f"link {link}; training workers {sorted(alive)} still running, cut off",
    )


def kill_workers(lab: Lab, t: Target) -> Fault:
    """The training processes on the node SIGKILLed (its agent lives); confirmed when every one of them is gone."""
    before = lab.worker_pids(t.node)
    start = time.time()
    lab.fault("kill-workers", t.node)
    survived = before & lab.worker_pids(t.node)
    say(f"{t.scenario}: killed the training processes on {t.node} after step {t.last_step}")
    return Fault(
        f"kill workers on {t.node}",
        start,
        bool(before) and not survived,
        f"workers {sorted(before)} gone"
        if before and not survived
        else f"workers before {sorted(before)}, still alive {sorted(survived)}",
    )


def kill_one_worker(lab: Lab, t: Target) -> Fault:
    """One training process on the node SIGKILLed (its highest rank; the lab runs one per node), its agent left
    running: with ``failover.in_place`` the agent starts that worker again alone. Notes every job node's worker pids
    before the kill (:meth:`Runner.after_fault` notes them again once the job logged its in-place recovery) for
    :func:`chaos.local.scenarios.check_survivors_kept_in_place`; confirmed when that worker is gone."""
    hosts = t.watch.get("hosts") or [t.node]
    before = lab.workers_by_host(hosts)
    ranked = sorted(before.get(t.node, []), key=lambda p: worker_rank(p) if worker_rank(p) is not None else -1)
    if not ranked:
        return Fault(f"kill one worker on {t.node}", time.time(), False, f"no training worker on {t.node}")
    pid, rank = ranked[-1], worker_rank(ranked[-1])
    start = time.time()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 2
    while _proc_state(pid) not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.02)
    gone = _proc_state(pid) in (None, "Z", "X")
    t.watch["in_place_pending"] = True
    t.watch["facts"] = {
        **t.watch.get("facts", {}),
        "in_place_kill": {"pid": pid, "node": t.node, "before": before, "after": {}},
        "memory_interval": 1,
    }
    say(f"{t.scenario}: SIGKILLed rank {rank} (pid {pid}) on {t.node} after step {t.last_step}; its agent lives")
    return Fault(
        f"kill rank {rank} on {t.node}",
        start,
        gone,
        f"worker pid {pid} (rank {rank}) " + ("gone" if gone else "still running 2 s after SIGKILL"),
    )


def _cpu_cgroup(pid: int) -> str | None:
    """The cpu controller's cgroup of a process (cgroup v1's ``cpu`` line, else v2's unified one), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = [ln.split(":", 2)[2] for ln in lines if "cpu" in ln.split(":", 2)[1].split(",")]
    v2 = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
    return (v1 or v2 or [None])[0]


def _throttled(cgroup_dir: str) -> int:
    """Periods in which the cgroup's quota throttled it (cpu.stat's nr_throttled), 0 when unknown."""
    try:
        stat = dict(ln.split() for ln in Path(cgroup_dir, "cpu.stat").read_text().splitlines() if ln.strip())
    except (OSError, ValueError):
        return 0
    return int(stat.get("nr_throttled", 0))


def slow_node(lab: Lab, t: Target, *, percent: int) -> Fault:
    """The node slowed, not stopped: every process on it held to ``percent`` of one CPU and of a node's CPU
    weight (``fault.sh slow``: a cgroup's CFS quota and shares, the other nodes in cgroups at full weight) until the
    scenario ends. Confirmed when its training workers are in that cgroup, running (not stopped), and the quota
    throttled them within 3 s.

    Measured: at 25% (a quota alone) the rank's own work took 3.6-6.3x as long on a quiet machine, but with the
    shared 2-core machine at load average 50-60 the quota did not bind (every process got less than it) and no
    straggler was named; with the weight added, 10% read x29-38 under that load, and 33% named it on a quiet machine
    (back within 1.5x 28.6 s after the slowdown began). Its heartbeat and keep-alive threads keep running."""
    before = lab.worker_pids(t.node)
    start = time.time()
    cgroup_dir, moved = lab.fault("slow", t.node, str(percent)).strip().splitlines()[-1].split()
    t.watch.update(
        slowed_node=t.node,
        facts={**t.watch.get("facts", {}), "slow_node": t.node, "slow_ranks": t.ranks, "spare": t.job.batch_host},
    )
    # the workers now (a pid read before may have been a short-lived child of a worker, named after it)
    workers = lab.worker_pids(t.node)
    where = {p: _cpu_cgroup(p) for p in workers}
    inside = {p for p, cg in where.items() if (cg or "").rstrip("/").endswith("/" + Path(cgroup_dir).name)}
    deadline = time.monotonic() + 3
    while not _throttled(cgroup_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    throttled = _throttled(cgroup_dir)
    running = {p for p in inside if worker_rank(p) is not None and _proc_state(p) not in (None, "T", "t", "Z")}
    say(
        f"{t.scenario}: slowed {t.node} (ranks {t.ranks}) to {percent}% of one CPU after step "
        f"{t.last_step}; throttled in {throttled} periods so far"
    )
    return Fault(
        f"slow {t.node} to {percent}% CPU",
        start,
        bool(before) and bool(workers) and running == workers and throttled > 0,
        f"{moved} processes of {t.node} moved to {cgroup_dir}; its training workers {sorted(workers)} there: "
        f"{sorted(inside)} (their cpu cgroups {where}), running (not stopped): {sorted(running)}; the "
        f"quota throttled them in {throttled} periods of 10 ms within 3 s",
    )


def slow_node_in_place(lab: Lab, t: Target, *, percent: int) -> Fault:
    """:func:`slow_node` in a ``failover.in_place`` job with a spare: notes every job node's worker pids before the
    slowdown (:meth:`Runner.after_fault` notes them again once the job logged its in-place recovery) and the nodes
    that ran none (the spares, where the straggler's ranks must go), for
    :func:`chaos.local.scenarios.check_survivors_kept_after_node_loss`."""
    hosts = t.watch.get("hosts") or [t.node]
    before = lab.workers_by_host(hosts)
    fault = slow_node(lab, t, percent=percent)
    t.watch["in_place_pending"] = True
    spares = [h for h, pids in before.items() if not pids and h != t.node]
    loss = {"pids": before.get(t.node, []), "node": t.node, "new_nodes": spares, "before": before, "after": {}}
    t.watch["facts"] = {**t.watch.get("facts", {}), "in_place_kill": loss, "memory_interval": 1}
    return fault


def _proc_state(pid: int) -> str | None:
    """A process's state letter (R, S, T, Z, ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def await_wedge(lab: Lab, t: Target) -> Fault:
    """The job wedges itself (``--fault.wedge_at_step``: rank ``WEDGED_RANK``'s main thread blocks at the start of the
    step after the one just logged): wait for the hook's marker in the run directory (it holds the worker's pid;
    its time is the fault's), then confirm the worker alive and not stopped over ~1 s: only its progress tells."""
    deadline = time.monotonic() + 120
    marker = None
    while time.monotonic() < deadline:
        marker = next(t.run_dir.glob(".fault-wedge-step*"), None)
        if marker is not None and marker.read_text().strip():
            break
        time.sleep(0.05)
    if marker is None:
        return Fault("wedged main thread", time.time(), False, f"no wedge marker in {t.run_dir} within 120 s")
    pid, at = int(marker.read_text()), marker.stat().st_mtime
    step = int(marker.name.removeprefix(".fault-wedge-step"))
    states = []
    for _ in range(3):
        states.append(_proc_state(pid))
        time.sleep(0.3)
    alive = all(s is not None and s not in ("T", "t", "Z", "X") for s in states)
    rank = worker_rank(pid) if alive else None
    node = next((h for h in t.watch.get("hosts", []) if pid in lab.worker_pids(h)), "?") if alive else "?"
    t.watch["facts"] = {**t.watch.get("facts", {}), "wedge": {"step": step, "rank": rank, "pid": pid, "time": at}}
    say(f"{t.scenario}: rank {rank} (pid {pid} on {node}) blocked its main thread at step {step}; states {states}")
    return Fault(
        f"wedged main thread of rank {rank} on {node}",
        at,
        alive and rank == WEDGED_RANK,
        f"{marker.name} holds pid {pid} (rank {rank}); its states over 0.9 s {states} (alive, not stopped)",
    )


def preempt(lab: Lab, t: Target) -> Fault:
    """SIGUSR1 to the batch script, as Slurm's ``--signal=B:USR1@T`` sends it before the time limit."""
    start = time.time()
    slurmctl.scancel(t.job.job_id, signal="USR1", batch=True, env=lab.env)
    say(f"{t.scenario}: sent SIGUSR1 to the batch script (as --signal=B:USR1@T does) after step {t.last_step}")
    return Fault(
        f"SIGUSR1 to batch on {t.job.batch_host}",
        start,
        True,
        f"scancel --signal=USR1 --batch {t.job.job_id} accepted by slurmctld",
    )


def kill_store_leader(lab: Lab, t: Target) -> Fault:
    """SIGKILL the etcd member that leads; confirmed when it is gone and the two others have elected a new leader
    (the time they did is the fault's detection, ``Target.watch["detections"]``)."""
    start = time.time()
    out = lab.store("kill-leader")  # "m0 -> m2 in 0.93 s": killed, who leads now, seconds from the kill
    m = re.fullmatch(r"(m\d+) -> (m\d+) in ([\d.]+) s", out.splitlines()[-1] if out else "")
    left = lab.store("pids").split()
    t.watch["store_hit"] = True
    if m is None:
        return Fault("SIGKILL etcd leader", start, False, f"fault.sh store kill-leader said {out!r}")
    before, now_leads, elected_s = m.group(1), m.group(2), float(m.group(3))
    t.watch["detections"] = [start + elected_s]
    say(
        f"{t.scenario}: SIGKILLed the etcd leader {before} after step {t.last_step}; {now_leads} leads "
        f"{elected_s:.1f} s later"
    )
    return Fault(
        f"SIGKILL etcd leader {before}",
        start,
        len(left) == 2 and now_leads != before,
        f"{before} gone ({len(left)} of 3 members running), {now_leads} elected {elected_s:.1f} s later",
    )


def stop_store(lab: Lab, t: Target) -> Fault:
    """Every etcd member SIGKILLed at once (all their hosts lost; the data on disk stays: a graceful stop would
    spend ~5 s in the leader's futile leadership transfer, with the store half gone); confirmed when none runs.
    The harness starts them again ``SlurmScenario.outage_s`` later."""
    start = time.time()
    lab.store("kill-all")
    left = lab.store("pids").split()
    t.watch.update(store_hit=True, store_stopped=start)
    say(f"{t.scenario}: SIGKILLed every etcd member after step {t.last_step} ({len(left)} left)")
    return Fault(
        "SIGKILL every etcd member",
        start,
        not left,
        "no member running" if not left else f"{len(left)} member(s) still running",
    )


@contextmanager
def _held(t: Target):
    """The job held at its next step boundary (its hold file, the scenario's ``hold``) while the block runs: a
    fault that takes seconds to land (``fault.sh`` on a loaded machine) still finds a 12-step tiny job training; the
    held peers meet a lost rank at the next step once let go, as they would have mid-step."""
    hold = t.run_dir / HOLD_FILE
    hold.touch()
    try:
        yield
    finally:
        hold.unlink(missing_ok=True)


def kill_workers_held(lab: Lab, t: Target) -> Fault:
    """:func:`kill_workers` with the job held until the kill landed. (CI, 2026-11-29: ``fault.sh kill-workers`` took
    2 s after the fault step, the job had trained its last 5 steps and committed step 12 meanwhile, and the restart
    found nothing to train: "no attempt started and trained after it".)"""
    with _held(t):
        return kill_workers(lab, t)


def stop_store_then_kill_workers(lab: Lab, t: Target) -> Fault:
    """Every etcd member stopped, then the training processes on a node SIGKILLed while none answers: the fault's
    time is the worker kill (the restart it needs waits for the store). The job is held from before the outage until
    the kill (:func:`_held`), so its workers are still there to be killed however fast the rest of it would run."""
    with _held(t):
        outage = stop_store(lab, t)
        kill = kill_workers(lab, t)
    return Fault(
        f"{outage.label}, then {kill.label}",
        kill.time,
        outage.confirmed and kill.confirmed,
        f"{outage.evidence}; {kill.evidence}",
    )


# Job-log lines that show a fault was noticed. Slurm's node DOWN is added for node faults: it is the only sign for
# batch-host-kill, whose job log ends with the node.
# the etcd rendezvous names the lost nodes itself (the c10d agent's line is "[agent] lost node(s) of this round")
RDZV_LOST_RE = re.compile(r"\[rendezvous\] lost node\(s\) of round \d+")


def agents_noticed(logs: list[tuple[float, str]]) -> list[float]:
    """An agent logged its failed worker group or the rendezvous re-forming (torch's lines, the c10d agent's or
    the etcd rendezvous's: training.goodput.analysis.DETECT_RE knows them all)."""
    return sorted(torchrun_detections(logs))


def in_place_noticed(logs: list[tuple[float, str]]) -> list[float]:
    """The killed worker's agent logged replacing it (``[agent] in-place: worker rank ...``), or a group failure."""
    return sorted(agents_noticed(logs) + [t for t, line in logs if "[agent] in-place: worker rank " in line])


def node_lost_in_place_noticed(logs: list[tuple[float, str]]) -> list[float]:
    """A survivor's agent (the rendezvous keeping its workers, a dead agent taken out) or the spare's."""
    return sorted(agents_or_watchdog_noticed(logs) + [t for t, line in logs if "[agent] in-place:" in line])


def store_unreachable_logged(logs: list[tuple[float, str]]) -> list[float]:
    """An agent said that no etcd member answers (its keep-alives, its watch, or a new round waiting)."""
    return [
        t
        for t, line in logs
        if "[rendezvous] membership store unreachable" in line
        or "[rendezvous] a new round waits for the membership store" in line
    ]


def agents_or_watchdog_noticed(logs: list[tuple[float, str]]) -> list[float]:
    """The survivors' agents (a failed collective ends their workers, or the lost node's keep-alives stop) or their
    heartbeat watchdog, seconds before Slurm marks the node DOWN."""
    return sorted(agents_noticed(logs) + [t for t, line in logs if "[watchdog]" in line])


def batch_script_signalled(logs: list[tuple[float, str]]) -> list[float]:
    """The batch script logged the pre-timeout signal."""
    return [t for t, line in logs if "SIGUSR1" in line]


def straggler_logged(logs: list[tuple[float, str]]) -> list[float]:
    """The job named a straggler (its ``[straggler]`` line)."""
    return [t for t, line in logs if "[straggler] rank " in line]


def wedge_logged(logs: list[tuple[float, str]]) -> list[float]:
    """A rank's watchdog said it is wedged, or an agent logged the failed worker group."""
    return sorted(agents_noticed(logs) + [t for t, line in logs if "is wedged: no progress in phase" in line])


def nothing_logged(logs: list[tuple[float, str]]) -> list[float]:
    return []


# ------------------------------------------------------------------------------------------- scenarios
def check_requeued(obs: Observation) -> Check:
    n = obs.facts["requeues"]
    return Check("Slurm requeued the job", n >= 1, f"{n} requeue(s), final state {obs.facts['final_state']}")


def check_restarted_in_allocation(obs: Observation) -> Check:
    """A new worker group started after the fault, and no requeue. (Counted by start events: with a spare the
    re-formed group's rank 0 may be the former spare, whose agent never restarted, so torch's restart count of
    the start record can stay 0.)"""
    n, r = obs.facts["requeues"], obs.facts["torchrun restarts"]
    starts = obs.facts.get("starts after the fault", 0)
    return Check(
        "torchrun restarted the workers, no requeue",
        n == 0 and starts >= 1,
        f"{starts} worker-group start(s) after the fault ({r} by torch's restart count), {n} requeue(s)",
    )


def check_resumed_newest(obs: Observation) -> Check:
    """The first attempt after the fault resumed from the newest checkpoint committed before it started, or from a
    newer in-memory snapshot (the memory tier: ``restored_from`` says memory or peer, at the step it resumed)."""
    t = obs.faults[0].time if obs.faults else float("inf")
    after = [r for r in obs.records if r.get("event") == "start" and r["time"] > t]
    if not after:
        return Check("resumed from the newest complete checkpoint", False, "no attempt started after the fault")
    committed = [r["step"] for r in obs.records if r.get("event") == "checkpoint" and r["time"] < after[0]["time"]]
    resumed, newest = after[0].get("resumed_from") or 0, max(committed, default=0)
    got = after[0].get("restored_from") or {}
    from_memory = got.get("tier") in ("memory", "peer") and got.get("step") == resumed and resumed > newest
    return Check(
        "resumed from the newest complete checkpoint",
        resumed == newest or from_memory,
        f"resumed from step {resumed}"
        + (f" (in-memory snapshot, {got['tier']})" if from_memory else "")
        + f"; newest committed to storage before the restart: {newest}",
    )


def check_continued_in_allocation(obs: Observation) -> Check:
    """A node was lost and the job went on in the same allocation: no requeue, the agents re-formed."""
    n, starts = obs.facts["requeues"], obs.facts["starts after the fault"]
    return Check(
        "continued inside the allocation, no requeue",
        n == 0 and starts >= 1,
        f"{n} requeue(s), {starts} training start(s) after the fault, final state {obs.facts['final_state']}",
    )


def check_spare_took_over(obs: Observation) -> Check:
    """The node that was lost is not in the world that finished, and the spare (the batch host) is."""
    lost, batch, last = obs.facts.get("killed_node"), obs.facts.get("batch_host"), obs.facts.get("final_nodes") or []
    ok = bool(lost) and lost not in last and batch in last
    return Check(
        "the spare took the lost node's place",
        ok,
        f"lost {lost}; nodes training at the end {sorted(last)} (batch host / spare {batch})",
    )


def check_spare_replaced_slow_node(obs: Observation) -> Check:
    """The slow node's agent left the job (the straggler's take-out note), and the nodes that train at the end are
    the spare (the batch host) and not the slow node."""
    slow, spare, last = obs.facts.get("slow_node"), obs.facts.get("spare"), obs.facts.get("final_nodes") or []
    left = [line for _, line in obs.logs if "[agent] this node left the job" in line]
    ok = bool(slow) and bool(left) and slow not in last and spare in last
    return Check(
        "the slow node left, the spare took its place",
        ok,
        f"{left[0].strip()[:160] if left else 'no agent said its node left the job'}; slow node {slow}; "
        f"nodes training at the end {sorted(last)} (batch host / spare {spare})",
    )


def check_killed_rank0(obs: Observation) -> Check:
    r = obs.facts.get("killed_ranks") or []
    return Check(
        "the killed node ran rank 0, not the batch script",
        0 in r and obs.facts.get("killed_node") != obs.facts.get("batch_host"),
        f"ranks on {obs.facts.get('killed_node')}: {r}; batch host {obs.facts.get('batch_host')}",
    )


def check_training_uninterrupted(obs: Observation) -> Check:
    """No attempt started after the fault with work left (a requeued rerun that finds the job finished is fine)."""
    t = obs.faults[0].time if obs.faults else float("inf")
    steps = {r["step"] for r in obs.records if r.get("event") == "step"}
    again = [
        r
        for r in obs.records
        if r.get("event") == "start" and r["time"] > t and (r.get("resumed_from") or 0) < max(steps, default=0)
    ]
    return Check(
        "training went on untouched",
        not again and bool(steps),
        f"{len(again)} attempt(s) started with work left after the fault; trained to step {max(steps, default=0)}",
    )


def check_no_requeue(obs: Observation) -> Check:
    n = obs.facts["requeues"]
    return Check("no requeue", n == 0, f"{n} requeue(s), final state {obs.facts['final_state']}")


def check_no_node_lost(obs: Observation) -> Check:
    """No agent declared a node lost: the store's trouble cost no member its place."""
    lost = [line for _, line in obs.logs if RDZV_LOST_RE.search(line) or "[agent] lost node(s)" in line]
    return Check(
        "no node declared lost", not lost, lost[0].strip()[:200] if lost else "no lost-node line in the job log"
    )


def _store_back(obs: Observation) -> float | None:
    return obs.facts.get("store_back")


def check_trained_through_outage(obs: Observation) -> Check:
    """Steps were logged while no etcd member ran (the collectives need no store), and the store came back."""
    t0, back = (obs.faults[0].time if obs.faults else None), _store_back(obs)
    if t0 is None or back is None:
        return Check("trained while no member answered", False, f"store stopped at {t0}, back at {back}")
    during = [r["step"] for r in obs.records if r.get("event") == "step" and t0 < r["time"] < back]
    return Check(
        "trained while no member answered",
        bool(during),
        f"steps {during[0]}..{during[-1]} logged during the {back - t0:.0f} s outage"
        if during
        else f"no step logged during the {back - t0:.0f} s outage",
    )


def check_agents_reconnected(obs: Observation) -> Check:
    """The agents said the store answers again (their keep-alives or watch resumed) once it was back."""
    started = obs.facts.get("store_started") or float("inf")  # the harness started the members again
    lines = [line for t, line in obs.logs if t >= started and "[rendezvous] " in line and "answers again" in line]
    return Check(
        "the agents reconnected",
        bool(lines),
        f"{len(lines)} agent line(s) after the store's return, e.g. {lines[0].strip()[:120]!r}"
        if lines
        else "no agent said the store answers again",
    )


STORE_BACK_TARGET_S = 5.0


def check_trained_again_after_store_back(obs: Observation) -> Check:
    """The worker group killed during the outage trains again within ``STORE_BACK_TARGET_S`` of the store's
    return (every member answering; the new round could only form then)."""
    t, back = (obs.faults[0].time if obs.faults else None), _store_back(obs)
    if t is None or back is None:
        return Check(
            f"trained again <= {STORE_BACK_TARGET_S:g} s after the store is back",
            False,
            f"fault at {t}, store back at {back}",
        )
    restarts = [r["time"] for r in obs.records if r.get("event") == "start" and r["time"] > t]
    steps = [r["time"] for r in obs.records if r.get("event") == "step" and restarts and r["time"] > restarts[0]]
    if not steps:
        return Check(
            f"trained again <= {STORE_BACK_TARGET_S:g} s after the store is back", False, "no step after the restart"
        )
    dt = steps[0] - back
    return Check(
        f"trained again <= {STORE_BACK_TARGET_S:g} s after the store is back",
        dt <= STORE_BACK_TARGET_S,
        f"first step of the new worker group {dt:.1f} s after every etcd member answered again "
        f"(store down {back - (obs.facts.get('store_stopped') or t):.0f} s)",
    )


@dataclass(frozen=True)
class SlurmScenario(Scenario):
    """A Slurm scenario (:class:`chaos.scenario.Scenario`: ``inject(lab, target) -> Fault``), the node it hits
    and how it is noticed."""

    target: Callable[[list[str], dict[str, list[int]], slurmctl.JobInfo], str] = last_host
    noticed: Callable[[list[tuple[float, str]]], list[float]] = nothing_logged  # from the job's log
    node_fault: bool = False  # the node is lost: Slurm marking it DOWN counts as noticed; it is revived after
    needs_spare: bool = False  # the job continues inside its allocation only with a hot spare
    # the etcd members are started again this long after the fault stopped them. An agent that first reaches the
    # store during the outage (the spare's starts once training does) waits for it: the job's note that the store
    # answered it before (training.launch.rendezvous.start), so the job is not held until every agent is a member
    outage_s: float | None = None
    train_args: tuple[str, ...] = ()  # the scenario's job only (wall time, never the math: the same reference)
    fault_step: int | None = None  # inject once the job logged this step (None: the run's --fault-step)
    spares: int | None = None  # the scenario's job runs with this many hot spares (None: the run's --spares)
    hold: bool = False  # the job holds at a step boundary while its run directory has HOLD_FILE (the injector's)
    # (needs hold) the harness holds the job from its first step logged with no member running until an agent said
    # the store answers again: the job outlasts the outage however short its steps, and runs at full speed otherwise
    hold_through_outage: bool = False


STORE_OUTAGE_S = 20.0  # issue 32's "every member down 20 s"
RELEASE_AFTER_S = 15.0  # a job held through an outage is let go this long after the store is back, said or not
STRAGGLER_FROM_STEP = 3  # early: the job needs straggler.steps slow steps, then steps at speed after the take-over
# The in-memory tier on (the default; a lean test job may turn it off): the straggler's node is taken out after a
# step's snapshot, a wedged rank's restart resumes from it.
MEMORY_TIER = ("--checkpoint.memory_interval", "1")
# failover.in_place with the in-memory tier; 1 s between steps (wall time only) keeps the job training while the
# harness notes the workers after the recovery (a tiny job's last steps were over before the look, 2026-11-29)
IN_PLACE_ARGS = ("--failover.in_place", "true", *MEMORY_TIER, "--fault.step_sleep_s", "1")
WEDGED_RANK = 1  # every job here has it (>= 2 nodes); with one worker per lab node it is not on rank 0's node


def scenarios(cfg: SlurmChaosConfig) -> dict[str, SlurmScenario]:
    """Every Slurm scenario by name (``chaos.catalog.PLATFORMS["slurm"]``)."""
    lost = 2 * cfg.interval - 1  # one async save may still be in flight when the fault hits
    in_alloc = (check_continued_in_allocation, check_spare_took_over, check_resumed_newest)
    node_lost = dict(noticed=agents_or_watchdog_noticed, node_fault=True, needs_spare=True)
    # a training node slowed early (an eviction needs straggler.steps slow steps after the first judged ones)
    slowed = dict(
        target=training_host_off_rank0,
        noticed=straggler_logged,
        needs_spare=True,
        fault_step=min(cfg.fault_step, STRAGGLER_FROM_STEP),
    )
    return scenario_table(
        "slurm",
        [
            SlurmScenario(
                "node-kill",
                kill_node,
                Expectation(max_steps_lost=lost),
                in_alloc,
                **node_lost,
                title="kill a training node outright -> the spare takes its place inside the allocation, no "
                "requeue; Slurm marks it DOWN, revive",
            ),
            SlurmScenario(
                "first-node-kill",
                kill_node,
                Expectation(max_steps_lost=lost),
                (check_killed_rank0, *in_alloc),
                target=rank0_host,
                **node_lost,
                title="kill the node running rank 0 -> the membership store lives off the compute nodes: the "
                "spare takes its place, no requeue",
            ),
            SlurmScenario(
                "network-cut",
                cut_link,
                Expectation(max_steps_lost=lost),
                in_alloc,
                **node_lost,
                title="take a training node's link down (its processes keep running, silent) -> the watchdog "
                "notices, the spare takes its place, no requeue; fence + revive",
            ),
            SlurmScenario(
                "worker-kill",
                kill_workers_held,
                Expectation(max_steps_lost=lost),
                (check_restarted_in_allocation, check_resumed_newest),
                noticed=agents_noticed,
                hold=True,
                title="kill the training processes on a node -> torchrun restart, no requeue",
            ),
            SlurmScenario(
                "worker-kill-in-place",
                kill_one_worker,
                Expectation(restart=False),
                (check_survivors_kept_in_place, check_recomputed_in_place, check_no_requeue),
                target=training_host_off_rank0,
                noticed=in_place_noticed,
                # never the math (the same reference): in-place recovery restores from the in-memory snapshots
                train_args=IN_PLACE_ARGS,
                title="SIGKILL one training process of a failover.in_place job -> its node's agent replaces it alone, "
                "the other workers keep their processes and recover in place: no restart, no requeue",
            ),
            SlurmScenario(
                "node-kill-in-place",
                kill_node_in_place,
                Expectation(restart=False),
                (
                    check_silent_node_replaced_in_place,
                    check_blocked_survivors_cut_in_place,
                    check_recomputed_in_place,
                    check_no_requeue,
                ),
                target=training_host_off_rank0,
                **{**node_lost, "noticed": node_lost_in_place_noticed},
                train_args=IN_PLACE_ARGS,
                title="kill a training node of a failover.in_place job (not rank 0's) -> the spare's worker joins "
                "the survivors' running epoch in its rank inside the allocation; a survivor blocked on the dead "
                "link cuts its group at its agent's request and keeps its process: no restart, no requeue",
            ),
            SlurmScenario(
                "first-node-kill-in-place",
                kill_node_in_place,
                Expectation(restart=False),
                (
                    check_silent_node_replaced_in_place,
                    check_blocked_survivors_cut_in_place,
                    check_rank0_joined_in_place,
                    check_recomputed_in_place,
                    check_no_requeue,
                ),
                target=rank0_host,
                **{**node_lost, "noticed": node_lost_in_place_noticed},
                train_args=IN_PLACE_ARGS,
                title="kill the node running rank 0 of a failover.in_place job -> the spare takes node rank 0 and "
                "the round's store, its worker rank 0 in the survivors' running epoch: no restart, no requeue",
            ),
            SlurmScenario(
                "preemption",
                preempt,
                Expectation(max_steps_lost=0),
                (check_requeued, check_resumed_newest),
                noticed=batch_script_signalled,
                title="pre-timeout SIGUSR1 -> checkpoint, self-requeue, 0 steps lost",
            ),
            SlurmScenario(
                "batch-host-kill",
                kill_node,
                Expectation(restart=False),
                (check_training_uninterrupted, check_requeued),
                target=batch_host,
                node_fault=True,
                title="kill the node running the batch script (the standby spare) -> training goes on "
                "untouched; the job, left without its batch script, is requeued by a surviving node and ends "
                "cleanly",
            ),
            SlurmScenario(
                "store-member-kill",
                kill_store_leader,
                Expectation(restart=False),
                (check_training_uninterrupted, check_no_requeue, check_no_node_lost),
                title="SIGKILL the etcd leader (of 3 members off the nodes) -> a new leader in about a second, "
                "training goes on untouched: 0 restarts, 0 steps lost, no requeue",
            ),
            SlurmScenario(
                "store-outage",
                stop_store,
                Expectation(restart=False),
                (
                    check_training_uninterrupted,
                    check_trained_through_outage,
                    check_agents_reconnected,
                    check_no_requeue,
                    check_no_node_lost,
                ),
                noticed=store_unreachable_logged,
                outage_s=STORE_OUTAGE_S,
                # held at a step boundary through the rest of the outage once a step was logged during it (it
                # outlasts the outage at full speed; 3.3 s per step for all 12 steps cost 74-87 s a run). A held
                # rank makes no progress: its wedge watchdog is off (wall time only: the same reference).
                hold=True,
                hold_through_outage=True,
                train_args=("--parallel.wedge_floor_s", "0"),
                title=f"SIGKILL every etcd member, start them {STORE_OUTAGE_S:g} s later -> training goes "
                "on, the agents pause their keep-alives and reconnect: 0 restarts, 0 steps lost",
            ),
            SlurmScenario(
                "store-outage-then-worker-kill",
                stop_store_then_kill_workers,
                Expectation(max_steps_lost=lost),
                (check_restarted_in_allocation, check_resumed_newest, check_trained_again_after_store_back),
                noticed=agents_noticed,
                outage_s=STORE_OUTAGE_S,
                # the job must still be training when the worker kill follows the store's (CI, 2026-11-28: on a
                # loaded machine the job had finished its 12 steps by then, no worker was left to kill, and the
                # scenario failed with "no torchrun worker processes on n3"): the fault holds it at a step boundary
                # until the kill (stop_store_then_kill_workers), instead of 3.3 s per step for all 12 steps
                hold=True,
                title=f"SIGKILL every etcd member for {STORE_OUTAGE_S:g} s and a node's training processes "
                f"meanwhile -> the new round waits for the store and trains <= {STORE_BACK_TARGET_S:g} s after "
                "it is back, no requeue",
            ),
            # A slow node, not a dead one: named from the ranks' work times, taken out after a step's snapshot, the
            # spare in its place; nothing recomputed. Slowed early (an eviction needs straggler.steps slow steps after
            # the first judged ones, then steps at speed to show the recovery).
            SlurmScenario(
                "straggler",
                functools.partial(slow_node, percent=cfg.slow_percent),
                Expectation(max_steps_lost=0),
                (
                    check_straggler_named,
                    check_spare_replaced_slow_node,
                    check_continued_in_allocation,
                    check_back_to_speed,
                ),
                **slowed,
                # 1 s between steps (wall time only; the work times compared exclude it): a tiny job's steps
                # were over before the slowdown, which takes seconds to inject on a busy machine, could bite
                train_args=(*MEMORY_TIER, "--fault.step_sleep_s", "1"),
                title=f"hold a training node (not rank 0's) to {cfg.slow_percent}% of one CPU (a cgroup's quota "
                "and weight) "
                "-> named a straggler, taken out after a snapshot, the spare takes its place inside the "
                "allocation: 0 steps recomputed",
            ),
            # failover.in_place: only the straggler's workers stop; the spare's join the survivors' running epoch
            SlurmScenario(
                "straggler-in-place",
                functools.partial(slow_node_in_place, percent=cfg.slow_percent),
                Expectation(restart=False, max_steps_lost=0),
                (
                    check_straggler_named,
                    check_spare_replaced_slow_node,
                    check_straggler_left_in_place,
                    check_survivors_kept_after_node_loss,
                    check_recomputed_in_place,
                    check_no_requeue,
                    check_back_to_speed,
                ),
                **slowed,
                train_args=IN_PLACE_ARGS,
                title=f"hold a training node of a failover.in_place job (not rank 0's) to {cfg.slow_percent}% of one "
                "CPU -> named a straggler, taken out after a snapshot: only its worker stops, the spare's joins the "
                "survivors' running epoch in its rank inside the allocation: no restart, no requeue",
            ),
            # The wedge bound's floor lowered to 3 s (a tiny step's bound is its floor; wall time only).
            # Two worker groups of one job (the old one's agents frozen, its workers training on): the old group runs
            # to its next commit, which the fence refuses, so up to two intervals are recomputed by the new group.
            SlurmScenario(
                "split-brain",
                split_brain,
                Expectation(noticed=False, max_steps_lost=2 * cfg.interval),
                (check_stale_group_fenced, check_fenced_nodes_left),
                spares=cfg.nodes,
                hold=True,
                title="SIGSTOP the training nodes' agents only (their workers train on) until the spares form a "
                "new round -> the commit fence stops the old group at its next commit (exit 9), its nodes leave "
                "the step; the new group finishes in the allocation, no requeue",
            ),
            SlurmScenario(
                "wedged-rank",
                await_wedge,
                Expectation(max_steps_lost=1),
                (check_wedge_declared, check_restarted_in_allocation, check_resumed_newest),
                noticed=wedge_logged,
                train_args=(
                    "--fault.wedge_at_step",
                    str(cfg.fault_step + 1),
                    "--fault.rank",
                    str(WEDGED_RANK),
                    "--parallel.wedge_floor_s",
                    "3",
                    *MEMORY_TIER,
                ),
                title="block one rank's main thread mid-step (its process and heartbeat thread live on) -> "
                "declared wedged from its progress, its agent kills it, torchrun restarts the workers inside "
                "the allocation",
            ),
        ],
    )


class Runner:
    def __init__(self, cfg: SlurmChaosConfig, lab: Lab, out_dir: Path):
        self.cfg, self.lab, self.out_dir = cfg, lab, out_dir
        self.shared = Path(cfg.work_dir) / "shared"
        # this interpreter: the project venv (scripts/venv.sh), on a file system every lab node sees
        self.python = sys.executable

    def job_config(self, run_name: str, extra: tuple[str, ...] = (), spares: int | None = None) -> SlurmJobConfig:
        return SlurmJobConfig(
            run_name=run_name,
            preset=self.cfg.preset,
            train_args=(*self.cfg.job_train_args, *extra),
            nodes=self.cfg.nodes,
            spares=self.cfg.spares if spares is None else spares,
            etcd_env=self.lab.etcd_env,
            shared_dir=str(self.shared),
            repo_dir=str(REPO_DIR),
            python=self.python,
            slurm_conf=self.lab.env["SLURM_CONF"],
            max_requeues=3,
            max_restarts=3,
            shutdown_timeout_s=60,
            rdzv_port=self.cfg.rdzv_port,
            step_timeout_s=int(self.cfg.scenario_timeout_s) + 60,
        )

    def fresh(self, job: SlurmJobConfig) -> None:
        for d in (job.run_dir, job.checkpoint_dir):
            shutil.rmtree(d, ignore_errors=True)
        Path(job.run_dir).mkdir(parents=True)

    def submit(self, job: SlurmJobConfig) -> int:
        script = Path(job.run_dir) / "job.sbatch"
        script.write_text(render(job))
        return slurmctl.sbatch(script, env=self.lab.env)

    def final_checkpoint(self, job: SlurmJobConfig) -> Path:
        return Path(job.checkpoint_dir) / f"step_{self.cfg.steps:08d}"

    # ---------------------------------------------------------------- reference
    def reference_key(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([self.cfg.nodes, self.cfg.preset, self.cfg.job_train_args]).encode())
        for p in sorted((REPO_DIR / "training").rglob("*")):
            if p.suffix in (".py", ".toml"):
                h.update(p.relative_to(REPO_DIR).as_posix().encode())
                h.update(p.read_bytes())
        return h.hexdigest()[:12]

    def reference(self) -> tuple[SlurmJobConfig, float | None]:
        """The uninterrupted run, via scripts/train_slurm.sh (cached by config + training code)."""
        job = self.job_config(f"reference-{self.reference_key()}")
        final = self.final_checkpoint(job)
        if (final / MARKER).is_file():
            say(f"reference: cached ({final})")
            return job, None
        self.fresh(job)
        t0 = time.monotonic()
        say(f"reference: uninterrupted run via scripts/train_slurm.sh ({self.cfg.steps} steps, {self.cfg.nodes} nodes)")
        log = self.out_dir / "reference.log"
        with open(log, "w") as f:
            rc = subprocess.run(
                [
                    str(REPO_DIR / "scripts" / "train_slurm.sh"),
                    "--run-name",
                    job.run_name,
                    "--shared-dir",
                    str(self.shared),
                    "--nodes",
                    str(self.cfg.nodes),
                    "--spares",
                    str(self.cfg.spares),
                    "--preset",
                    self.cfg.preset,
                    "--etcd-env",
                    self.lab.etcd_env,
                    "--python",
                    self.python,
                    "--max-restarts",
                    "0",
                    "--no-requeue",
                    "--rdzv-port",
                    str(job.rdzv_port),
                    "--step-timeout",
                    str(job.step_timeout_s),
                    "--follow-timeout",
                    str(self.cfg.scenario_timeout_s),
                    "--",
                    *self.cfg.job_train_args,
                ],
                env=self.lab.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=self.cfg.scenario_timeout_s + 120,
            ).returncode
        if rc != 0 or not (final / MARKER).is_file():
            raise RuntimeError(f"reference run failed (exit {rc}); see {log}")
        starts = [r for r in parse_records(Path(job.metrics_path).read_text()) if r["event"] == "start"]
        if len(starts) != 1:
            shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
            raise RuntimeError(f"the reference run was interrupted ({len(starts)} starts); see {log}")
        wall = time.monotonic() - t0
        say(f"reference: done in {wall:.0f} s")
        return job, wall

    # ---------------------------------------------------------------- one scenario
    def scenario(self, sc: SlurmScenario, ref: SlurmJobConfig) -> ScenarioResult:
        """Submit the job, inject ``sc``'s fault once the job logged the fault step, follow it to its end and judge
        it against the reference."""
        job = self.job_config(f"chaos-{sc.name}", sc.train_args, sc.spares)
        if sc.hold:
            job = replace(job, train_args=(*job.train_args, "--fault.hold_file", str(Path(job.run_dir) / HOLD_FILE)))
        self.fresh(job)
        res = ScenarioResult(
            name=sc.name, title=sc.title, outcome=sc.expect.outcome, workdir=job.run_dir, t0=time.time()
        )
        t_start = time.monotonic()
        jid = self.submit(job)
        res.figures["job"] = jid
        say(f"{sc.name}: {sc.title}: job {jid}")
        seen = Seen(
            jid, Tail(Path(job.metrics_path)), Tail(Path(job.log_pattern.replace("%j", str(jid)))), Path(job.run_dir)
        )
        self.follow(sc, seen, res, deadline=t_start + self.cfg.scenario_timeout_s)
        time.sleep(0.5)
        seen.read()
        ended = time.time()
        res.wall_s = round(time.monotonic() - t_start, 1)
        if not seen.faults and not res.error:
            res.error = f"the job ended before step {sc.fault_step or self.cfg.fault_step}; no fault was injected"
        res = self.verdict(sc, job, ref, seen, res)
        res.figures["phases_s"] = phases(res.t0, seen, seen.detections + sc.noticed(seen.logs), ended, time.time())
        say(f"{sc.name}: phases (s from submit): {res.figures['phases_s']}")
        return res

    def follow(self, sc: SlurmScenario, seen: Seen, res: ScenarioResult, deadline: float) -> None:
        """Poll the job until it ends. A timeout or a harness error becomes ``res.error`` and cancels the job; a
        killed node is revived whatever happened, to leave the lab whole for the next scenario."""
        watch = seen.watch
        try:
            while time.monotonic() < deadline:
                if self.poll(sc, seen, res):
                    break
                time.sleep(0.25)
            else:
                res.error = (
                    f"timed out after {self.cfg.scenario_timeout_s:.0f} s (job {seen.jid} "
                    f"{seen.info.state if seen.info else '?'})"
                )
                slurmctl.scancel(seen.jid, env=self.lab.env)
        except BaseException as e:  # noqa: BLE001 - one scenario's failure is reported, the others still run
            res.error = f"{type(e).__name__}: {e}"
            try:
                slurmctl.scancel(seen.jid, env=self.lab.env)
            except slurmctl.SlurmError:
                pass
            if not isinstance(e, Exception):  # Ctrl-C: the job is cancelled, the node revived, then stop
                raise
        finally:
            reviver = watch.get("reviver")
            if reviver is not None:
                reviver.wait(timeout=120)
            if watch.get("killed_node") and not watch.get("revived"):
                self.lab.fault("revive", watch["killed_node"])
            restarter = watch.get("store_restarter")
            if restarter is not None:
                restarter.wait(timeout=120)
            if watch.get("store_hit"):  # the next scenario gets every member back
                self.lab.store("start")
            if watch.get("slowed_node"):  # full speed for the next scenario
                self.lab.fault("unslow", watch["slowed_node"])

    def poll(self, sc: SlurmScenario, seen: Seen, res: ScenarioResult) -> bool:
        """One look at the job: inject the fault once it is due, then note what the platform does. True once the
        job ended."""
        seen.read()
        info = seen.info = slurmctl.job_info(seen.jid, env=self.lab.env)
        if info is None:
            raise RuntimeError(f"job {seen.jid} vanished from slurmctld")
        watch = seen.watch
        last_step = max((r["step"] for r in seen.records if r["event"] == "step"), default=0)
        due = sc.fault_step or self.cfg.fault_step
        if not seen.faults and info.state == "RUNNING" and last_step >= due:
            seen.faults.append(self.inject(sc, info, last_step, watch, seen.run_dir))
            seen.detections += watch.pop("detections", [])
            watch["fault_time"] = seen.faults[0].time
            res.events.append({"time": seen.faults[0].time, "kind": "fault", "label": seen.faults[0].label})
        elif seen.faults and sc.node_fault and "down" not in watch:
            state = slurmctl.node_states(env=self.lab.env).get(watch["killed_node"], "")
            if state.startswith("DOWN"):
                watch["down"] = time.time()
                seen.detections.append(watch["down"])
                say(f"{sc.name}: {watch['killed_node']} is DOWN")
        if seen.faults:
            self.after_fault(sc, watch, info, res, seen.records)
            self.hold_through_outage(sc, seen)
        return info.terminal

    def verdict(
        self, sc: SlurmScenario, job: SlurmJobConfig, ref: SlurmJobConfig, seen: Seen, res: ScenarioResult
    ) -> ScenarioResult:
        """Judge what was seen (``chaos.verdict.judge``: the standard checks and ``sc``'s) into ``res``."""
        records, faults, watch, info = seen.records, seen.faults, seen.watch, seen.info
        starts = [r for r in records if r["event"] == "start"]
        res.figures.update(
            requeues=info.restarts if info else None,
            **{"torchrun restarts": max((int(r.get("restart_count") or 0) for r in starts), default=0)},
        )
        final = self.final_checkpoint(job)
        obs = Observation(
            records=records,
            faults=faults,
            detections=seen.detections + sc.noticed(seen.logs),
            exited_ok=info is not None and info.succeeded if info is not None and info.terminal else None,
            exit_detail=f"job {seen.jid} {info.state if info else '?'} exit {info.exit_code if info else '?'}",
            steps=self.cfg.steps,
            global_batch=global_batch(self.cfg),
            final_committed=(final / MARKER).is_file(),
            weight_diffs=compare_weights(final, self.final_checkpoint(ref)),
            reference_records=parse_records(Path(ref.metrics_path).read_text()),
            wall_s=res.wall_s,
            error=res.error,
            logs=seen.logs,
            checkpoint_dir=Path(job.checkpoint_dir),
            facts={
                **res.figures,
                "final_state": info.state if info else None,
                "starts after the fault": sum(1 for r in starts if faults and r["time"] > faults[0].time),
                "killed_node": watch.get("killed_node"),
                "killed_ranks": watch.get("killed_ranks"),
                "batch_host": info.batch_host if info else None,
                "final_nodes": watch.get("final_nodes"),
                "store_stopped": watch.get("store_stopped"),
                "store_started": watch.get("store_started"),
                "store_back": watch.get("store_back"),
                **watch.get("facts", {}),
            },
        )
        res.apply(judge(obs, sc.expect, sc.checks))
        res.timeline = [r for r in records if r["event"] in ("step", "start", "signal", "checkpoint", "end")]
        say(
            f"{sc.name}: {'PASS' if res.passed else 'FAIL'} ({obs.exit_detail}, {res.wall_s:.0f} s)"
            + "".join(f"\n    {'ok ' if c.ok else 'NO '} {c.name}: {c.detail}" for c in res.checks)
        )
        return res

    def inject(self, sc: SlurmScenario, info: slurmctl.JobInfo, last_step: int, watch: dict, run_dir: Path) -> Fault:
        """Inject ``sc``'s fault on the node it targets and confirm its effect."""
        hosts = slurmctl.run(["scontrol", "show", "hostnames", info.node_list], env=self.lab.env).split()
        watch["hosts"] = hosts
        ranks = self.lab.worker_ranks(hosts)
        node = sc.target(hosts, ranks, info)
        watch["restarts0"] = info.restarts
        watch["killed_ranks"] = ranks[node]
        if sc.node_fault:
            watch["killed_node"] = node
        return sc.inject(self.lab, Target(sc.name, info, node, ranks[node], last_step, watch, run_dir))

    def after_fault(
        self,
        sc: SlurmScenario,
        watch: dict,
        info: slurmctl.JobInfo,
        res: ScenarioResult,
        records: list[dict] | None = None,
    ) -> None:
        fault_t = watch.get("fault_time", float("inf"))
        # the job trained again after the fault: a new attempt, or the survivors' in-place recovery
        restarted = [r["time"] for r in records or [] if r["event"] in ("start", "in_place") and r["time"] > fault_t]
        if watch.get("slowed_node") and restarted:  # the job re-formed without it: its slowdown no longer counts
            watch["facts"].setdefault("slow_until", restarted[0])
        if (
            "final_nodes" not in watch
            and restarted
            and any(r["event"] == "step" and r["time"] > restarted[0] for r in records or [])
        ):
            # the nodes that run training workers once the job trains again after the fault (one /proc scan: the
            # few steps left after a recovery can be over before a slower per-host look comes round)
            ranks = self.lab.worker_ranks(watch.get("hosts", []))
            nodes = [h for h, r in ranks.items() if r and h != watch.get("killed_node")]
            if nodes:
                watch["final_nodes"] = nodes
        if watch.get("in_place_pending") and any(
            r["event"] == "in_place" and r["time"] > fault_t for r in records or []
        ):  # the survivors recovered in place: every node's workers now (worker-kill-in-place)
            watch["in_place_pending"] = False
            kill = watch["facts"]["in_place_kill"]
            kill["after"] = self.lab.workers_by_host(list(kill["before"]))
        if info.restarts > watch["restarts0"] and "requeued" not in watch:
            watch["requeued"] = time.time()
            res.events.append({"time": watch["requeued"], "kind": "requeue", "label": "requeued"})
            say(f"{sc.name}: job requeued (restart {info.restarts})")
        if sc.node_fault and "down" in watch and "reviver" not in watch:
            watch["reviver"] = self.lab.fault_async("revive", watch["killed_node"])
            # a cut node's processes still run: the lab's revive fences them first
            say(f"{sc.name}: reviving {watch['killed_node']}" + (" (fenced first)" if sc.inject is cut_link else ""))
        self.end_outage(sc, watch, res)
        rv = watch.get("reviver")
        if rv is not None and not watch.get("revived") and rv.poll() is not None:
            watch["revived"] = True
            res.events.append({"time": time.time(), "kind": "replace", "label": "node revived"})
            if rv.returncode != 0:
                raise RuntimeError(f"reviving {watch['killed_node']} failed: {rv.stdout.read()[-1000:]}")
            say(f"{sc.name}: {watch['killed_node']} is back")

    def hold_through_outage(self, sc: SlurmScenario, seen: Seen) -> None:
        """``sc.hold_through_outage``: once the job logged a step with no etcd member running (what the scenario
        shows: no collective needs the store), hold it at its next step boundary (the hold file) until an agent
        said the store answers again (or ``RELEASE_AFTER_S`` after the members answer), then let it finish."""
        watch, stopped = seen.watch, seen.watch.get("store_stopped")
        if not sc.hold_through_outage or stopped is None or "released" in watch:
            return
        hold = seen.run_dir / HOLD_FILE
        if "held" not in watch:
            if any(r["event"] == "step" and r["time"] > stopped for r in seen.records):
                hold.touch()
                watch["held"] = time.time()
                say(f"{sc.name}: a step was logged with no member running; holding the job until the store is back")
            return
        started, back = watch.get("store_started"), watch.get("store_back")
        answered = started is not None and any(
            t >= started and "[rendezvous] " in line and "answers again" in line for t, line in seen.logs
        )
        if answered or (back is not None and time.time() - back > RELEASE_AFTER_S):
            hold.unlink(missing_ok=True)
            watch["released"] = time.time()
            say(f"{sc.name}: {'an agent said the store answers again' if answered else 'store back'}; job let go")

    def end_outage(self, sc: SlurmScenario, watch: dict, res: ScenarioResult) -> None:
        """``sc.outage_s`` after the store was stopped, start every member again; note when they all answer."""
        stopped = watch.get("store_stopped")
        if sc.outage_s is None or stopped is None:
            return
        if "store_restarter" not in watch and time.time() - stopped >= sc.outage_s:
            watch["store_restarter"] = self.lab.store_async("start")
            watch["store_started"] = time.time()
            say(f"{sc.name}: starting the etcd members again after {watch['store_started'] - stopped:.0f} s")
        rs = watch.get("store_restarter")
        if rs is not None and "store_back" not in watch and rs.poll() is not None:
            if rs.returncode != 0:
                raise RuntimeError(f"starting the etcd members failed: {rs.stdout.read()[-1000:]}")
            watch["store_back"] = time.time()
            res.events.append({"time": watch["store_back"], "kind": "replace", "label": "etcd back"})
            say(
                f"{sc.name}: every etcd member answers again ({watch['store_back'] - watch['store_started']:.1f} s "
                "after the start)"
            )


def phases(t0: float, seen: Seen, noticed: list[float], ended: float, judged: float) -> dict[str, float | None]:
    """Where a scenario's wall time went, in seconds from its submit: the first step, the fault, the first sign it
    was noticed, the first step after a restart, the last step, the job seen ended, the verdict done (None: none)."""
    steps = [r["time"] for r in seen.records if r["event"] == "step"]
    fault = seen.faults[0].time if seen.faults else None
    restarts = [r["time"] for r in seen.records if r["event"] == "start" and fault is not None and r["time"] > fault]
    again = [t for t in steps if restarts and t > restarts[0]]
    points = {
        "first step": min(steps, default=None),
        "fault": fault,
        "noticed": min(noticed, default=None),
        "trains again": min(again, default=None),
        "last step": max(steps, default=None),
        "ended": ended,
        "judged": judged,
    }
    return {k: None if v is None else round(v - t0, 1) for k, v in points.items()}


def global_batch(cfg: SlurmChaosConfig) -> int:
    """The job's samples per step, as the training config resolves it (preset < flags)."""
    from training.config import load_config

    return load_config(["--preset", cfg.preset, *cfg.job_train_args]).train.global_batch


# ------------------------------------------------------------------------------------------------ run
COLUMNS = ("requeues", "torchrun restarts")


def run(cfg: SlurmChaosConfig, out_dir: Path, progress: Callable[[str], None] = say) -> dict:
    cfg.validate()
    out_dir.mkdir(parents=True, exist_ok=True)
    lab = Lab(cfg.lab_root, cfg.lab_nodes)
    t0 = time.monotonic()
    lab.up()
    lab_settings = (Path(cfg.lab_root) / "run" / "settings").read_text().strip()
    table = scenarios(cfg)
    try:
        runner = Runner(cfg, lab, out_dir)
        ref, ref_wall = runner.reference()
        reference = {"checkpoint": str(runner.final_checkpoint(ref)), "wall_s": ref_wall, "cached": ref_wall is None}
        results = [runner.scenario(table[name], ref) for name in cfg.names]
    finally:
        if lab.started_here and not cfg.keep_lab:
            lab.down()
            progress("lab: down (this run started it)")
    rows = report.targets(cfg.interval, {r.name: r for r in results})
    png = report.timeline_png(
        out_dir / "timeline.png",
        results,
        f"Slurm chaos test: {cfg.nodes} nodes + {cfg.spares} spare, {cfg.preset}, "
        f"{cfg.steps} steps, checkpoint every {cfg.interval} ({lab_settings})",
    ).path
    report.write_json(
        out_dir / "report.json", "slurm", {**asdict(cfg), "lab": lab_settings}, results, reference, rows, png
    )
    return {
        "passed": all(r.passed for r in results),
        "results": results,
        "wall_s": time.monotonic() - t0,
        "table": report.table(results, columns=COLUMNS),
        "breakdown": report.breakdown_table(results),
        "targets": report.targets_table(rows),
    }


def preflight() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm lab needs root (munge, slurmd, network namespaces)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "Slurm is not installed and there is no apt-get to install it"
    return None


def build_parser() -> argparse.ArgumentParser:
    d = SlurmChaosConfig()
    p = argparse.ArgumentParser(
        prog="python -m chaos.slurm",
        description=__doc__.format(listing=catalog.listing("slurm")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenarios", default=d.scenarios, help="comma-separated scenario names (default: all)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--nodes", type=int, help=f"nodes (env NODES; {d.nodes})")
    p.add_argument("--preset", default=os.environ.get("PRESET") or d.preset, help="training preset (default debug)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"steps per job (default {d.steps})")
    p.add_argument("--interval", type=int, default=d.interval, help=f"checkpoint interval (default {d.interval})")
    p.add_argument(
        "--fault-step", type=int, default=d.fault_step, help=f"fault after this step (default {d.fault_step})"
    )
    p.add_argument("--spares", type=int, help=f"hot-spare nodes per job (env SPARES; {d.spares})")
    p.add_argument("--work-dir", default=d.work_dir, help=f"shared dir for jobs + reports (default {d.work_dir})")
    p.add_argument(
        "--lab-root",
        default=os.environ.get("SLAB_ROOT") or d.lab_root,
        help="lab root (env SLAB_ROOT; other SLAB_* settings are read from the environment)",
    )
    p.add_argument("--keep-lab", action="store_true", help="leave a lab this run started running")
    p.add_argument("--rdzv-port", type=int, default=d.rdzv_port, help=f"rendezvous base port (default {d.rdzv_port})")
    p.add_argument("--scenario-timeout", type=float, default=d.scenario_timeout_s, help="seconds per scenario")
    p.add_argument(
        "--slow-percent",
        type=int,
        default=d.slow_percent,
        help=f"straggler: the slow node's percent of one CPU (default {d.slow_percent}: a third of its speed)",
    )
    p.add_argument("--out", type=Path, help="report directory (default <work-dir>/reports/<time>)")
    p.add_argument("train_args", nargs="*", help="after --: extra training flags for every job")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    d = SlurmChaosConfig()
    try:  # make chaos-test's NODES and SPARES, as make train reads them (a flag wins)
        a.nodes = a.nodes if a.nodes is not None else env_count("NODES", d.nodes, 1)
        a.spares = a.spares if a.spares is not None else env_count("SPARES", d.spares, 0)
    except EnvFlagError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.list:
        print(catalog.listing("slurm"))
        return 0
    cfg = SlurmChaosConfig(
        scenarios=a.scenarios,
        nodes=a.nodes,
        preset=a.preset,
        steps=a.steps,
        interval=a.interval,
        fault_step=a.fault_step,
        train_args=tuple(a.train_args),
        work_dir=os.path.abspath(a.work_dir),
        lab_root=os.path.abspath(a.lab_root),
        keep_lab=a.keep_lab,
        scenario_timeout_s=a.scenario_timeout,
        spares=a.spares,
        rdzv_port=a.rdzv_port,
        slow_percent=a.slow_percent,
    )
    try:
        cfg.validate()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    why = preflight()
    if why:
        print(f"error: cannot run the Slurm chaos test here: {why}", file=sys.stderr)
        return 3
    out_dir = a.out or Path(cfg.work_dir) / "reports" / time.strftime("%Y%m%d-%H%M%S")
    rep = run(cfg, out_dir)
    print()
    print(rep["table"])
    print(rep["breakdown"])
    print(rep["targets"])
    n = len(rep["results"])
    print(
        f"\n{'PASS' if rep['passed'] else 'FAIL'}: {sum(r.passed for r in rep['results'])}/{n} scenarios in "
        f"{rep['wall_s']:.0f} s; report {out_dir / 'report.json'}, timeline {out_dir / 'timeline.png'}"
    )
    return 0 if rep["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

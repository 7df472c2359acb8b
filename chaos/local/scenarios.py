"""Local scenarios: how each fault is injected on simulated nodes, and what its verdict adds to the standard one.

Each scenario starts a fresh simulated cluster on a fresh checkpoint directory, injects its fault once the job
has logged ``cfg.kill_step`` (mid checkpoint interval), lets the job finish, and is judged by
``chaos.verdict.judge`` from an :class:`~chaos.verdict.Observation` of the run against the uninterrupted
reference. Scenario-specific checks are plain functions of that observation, so they can be tested on a
run without the fault (``tests/unit/failover/test_verdicts.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from training.goodput.analysis import effective_steps, held_before, load_records, split_attempts, world_sizes
from chaos.local.cluster import ClusterError, LocalCluster, confirm

# Their names stay importable from here (callers import them from this module).
from chaos.grey import (
    BACK_TO_SPEED,  # noqa: F401
    STRAGGLER_NAMED,  # noqa: F401
    back_to_speed_s,  # noqa: F401
    check_back_to_speed,  # noqa: F401
    check_straggler_named,
    check_wedge_declared,
    slowdown,  # noqa: F401
)
from chaos.local.config import LocalChaosConfig
from chaos.local.split_brain import check_stale_group_fenced, inject_split_brain
from chaos.report import TIMELINE_EVENTS, ScenarioResult
from chaos.scenario import Scenario
from chaos.scenario import table as scenario_table
from chaos.verdict import Check, Expectation, Fault, Observation, compare_weights, judge
from training.checkpoint import MARKER
from training.checkpoint.run_lock import LOCK_NAME
from training.launch import LaunchConfig
from training.launch.rendezvous.members import process_state


class ScenarioFailed(RuntimeError):
    """The scenario could not proceed (the job died early, or a wait timed out)."""


class ScenarioRun:
    """One scenario's simulated cluster, paths and waits; ``facts`` collects what its checks need."""

    def __init__(
        self,
        cfg: LocalChaosConfig,
        workdir: Path,
        *,
        rdzv_id: str,
        min_nodes: int,
        extra: tuple[str, ...] = (),
        max_restarts: int | None = None,
        spares: int = 0,
        hold: bool = False,
    ):
        self.cfg = cfg
        self.workdir = workdir
        if workdir.exists():
            shutil.rmtree(workdir)
        self.out = workdir / "job"
        self.hold_file = workdir / "hold-after-step"  # see held(); the job looks for it only when `hold`
        if hold:
            extra = (*extra, "--fault.hold_file", str(self.hold_file))
        self.ckpt = self.out / "checkpoints"
        self.metrics = self.out / "metrics.jsonl"
        launch = LaunchConfig(
            min_nodes=min_nodes,
            max_nodes=cfg.nodes,
            spares=spares,
            nproc_per_node=cfg.nproc_per_node,
            rdzv_id=rdzv_id,
            external_store=True,
            coordinator=cfg.coordinator,
            max_restarts=cfg.max_restarts if max_restarts is None else max_restarts,
            train_timeout_s=cfg.train_timeout_s,
            train_args=tuple(cfg.training_args(self.out, *extra)),
        )
        self.cluster = LocalCluster(workdir, launch)
        self.facts: dict = {}
        self.deadline = time.monotonic() + cfg.scenario_timeout_s

    def records(self) -> list[dict]:
        return load_records(self.metrics)

    def steps(self) -> list[dict]:
        return [r for r in self.records() if r.get("event") == "step"]

    def wait_for(self, pred: Callable[[], object], what: str, poll: float = 0.1):
        """Poll ``pred`` until truthy; fail if every agent exited or the scenario ran out of time."""
        while True:
            v = pred()
            if v:
                return v
            if not self.cluster.alive():
                raise ScenarioFailed(f"the job ended before {what}: exit codes {self.cluster.exit_codes()}")
            if time.monotonic() > self.deadline:
                raise ScenarioFailed(f"timed out after {self.cfg.scenario_timeout_s:.0f} s waiting for {what}")
            time.sleep(poll)

    def wait_step(self, step: int, *, world: int | None = None, after: float = 0.0) -> dict:
        def hit():
            for r in self.steps():
                if r["step"] >= step and r["time"] > after and (world is None or r["world_size"] == world):
                    return r
            return None

        return self.wait_for(hit, f"step {step}" + (f" at world size {world}" if world else ""))

    @contextmanager
    def held(self):
        """Every rank waits after its next step until the block ends (``--fault.hold_file``): a short job cannot
        finish while the harness brings a node back, however slow the machine. The scenario must be ``hold``."""
        self.hold_file.touch()
        try:
            yield
        finally:
            self.hold_file.unlink(missing_ok=True)

    def start_until_kill_step(self) -> None:
        """Start every node and wait until the job logged ``cfg.kill_step`` (mid checkpoint interval)."""
        self.cluster.start_all()
        self.wait_step(self.cfg.kill_step)

    def wait_start_after(self, t: float) -> dict:
        return self.wait_for(
            lambda: next((r for r in self.records() if r.get("event") == "start" and r["time"] > t), None),
            "the restarted workers to start",
        )


# ------------------------------------------------------------------------------------------ injection
def _victim(run: ScenarioRun) -> int:
    """A node that does not host rank 0 (so 'first node' and 'other node' failures differ)."""
    first = run.cluster.node_of_rank(0)
    return next(i for i in reversed(range(run.cfg.nodes)) if i != first)


def inject_worker_kill(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    run.cluster.signal_worker(_victim(run), signal.SIGKILL)


def inject_node_loss_rejoin(run: ScenarioRun) -> None:
    cfg = run.cfg
    run.start_until_kill_step()
    victim = _victim(run)
    run.cluster.kill_node(victim)
    t_kill = run.cluster.events[-1]["time"]
    small = (cfg.nodes - 1) * cfg.nproc_per_node
    first_small = run.wait_step(1, world=small, after=t_kill)
    _rejoin_held(run, victim, after_small_step=first_small["step"] + 1, after=t_kill)


def _rejoin_held(run: ScenarioRun, victim: int, *, after_small_step: int, after: float, fence: bool = False) -> None:
    """Once the smaller job trained `after_small_step`, start a fresh agent for `victim` while the job is held at a
    step boundary, and let it go on once it trains at full size again: the job cannot end before the rejoin.
    ``fence``: SIGKILL the victim's (stopped) processes first, unrecorded, as a silent machine is fenced."""
    cfg = run.cfg
    run.wait_step(after_small_step, world=(cfg.nodes - 1) * cfg.nproc_per_node, after=after)  # trains on small
    with run.held():  # after the step just seen or a later one (a step is recorded before its hold point)
        if fence:
            run.cluster.kill_node(victim, record=False)
        run.cluster.start_node(victim, kind="rejoin")
        run.wait_step(1, world=cfg.world, after=run.cluster.events[-1]["time"])


def inject_silent_node(run: ScenarioRun) -> None:
    """SIGSTOP a whole node mid-training; once the survivors train on without it, the machine is fenced
    (SIGKILL, memory gone) and a fresh node rejoins, as in node-loss-rejoin."""
    cfg = run.cfg
    run.start_until_kill_step()
    victim = _victim(run)
    run.facts["silent_node"] = victim
    run.facts["silent_ranks"] = [r for r in range(cfg.world) if run.cluster.node_of_rank(r) == victim]
    run.facts["silent_agent_pid"] = run.cluster.current(victim).proc.pid
    run.cluster.stop_node(victim)
    t_stop = run.cluster.events[-1]["time"]
    small = (cfg.nodes - 1) * cfg.nproc_per_node
    first_small = run.wait_step(1, world=small, after=t_stop)
    _rejoin_held(run, victim, after_small_step=first_small["step"] + 1, after=t_stop, fence=True)


def inject_node_kill_with_spare(run: ScenarioRun) -> None:
    """SIGKILL a training node (not rank 0's) of a fixed-size job while a hot spare waits in the rendezvous; no
    replacement is started: only the spare can keep the job at full size. Records which nodes were spares at
    the kill and which ranks they host once the job trains again."""
    run.start_until_kill_step()
    c = run.cluster
    spares, victim = spares_and_a_victim(run)
    run.facts["spare_nodes"], run.facts["killed_node"] = spares, victim
    c.kill_node(victim)
    _record_spare_takeover(run, spares)


def training_and_spares(run: ScenarioRun) -> tuple[list[int], list[int]]:
    """(nodes whose agent runs workers, nodes whose agent waits as a hot spare), among the running agents."""
    c = run.cluster
    alive = sorted({n.index for n in c.alive()})
    training = [i for i in alive if c.workers(i)]
    return training, [i for i in alive if i not in training]


def spares_and_a_victim(run: ScenarioRun) -> tuple[list[int], int]:
    """(the hot spares, the last training node that does not run rank 0): the target of a fault a spare must
    absorb (rank 0's node also hosts the round's store: first-node-kill is its own scenario)."""
    training, spares = training_and_spares(run)
    first = run.cluster.node_of_rank(0)
    victim = next((i for i in reversed(training) if i != first), None)
    if not spares or victim is None:
        raise ScenarioFailed(
            f"need a spare and a training node besides rank 0's: training {training}, "
            f"spares {spares}, rank 0 on node{first}"
        )
    return spares, victim


def spares_and_rank0s_node(run: ScenarioRun) -> tuple[list[int], int]:
    """(the hot spares, the node running rank 0): the target of first-node-kill-in-place."""
    training, spares = training_and_spares(run)
    first = run.cluster.node_of_rank(0)
    if not spares or first is None or len(training) < 2:
        raise ScenarioFailed(
            f"need a spare, rank 0's node and a training node besides it: training {training}, spares {spares}, "
            f"rank 0 on node{first}"
        )
    return spares, first


def _record_spare_takeover(run: ScenarioRun, spares: list[int]) -> dict:
    """After the fault just recorded: wait for the job's next step and record which ranks the spares host.
    Returns the start record of the attempt that trained it."""
    c = run.cluster
    start = run.wait_start_after(c.events[-1]["time"])  # a step of the old attempt may still be logged after it
    first_after = run.wait_step(1, after=start["time"])
    run.facts["spare_ranks_after"] = [r for r in range(run.cfg.world) if c.node_of_rank(r) in spares]
    c.event(
        "observed",
        None,
        f"step {first_after['step']} at world {first_after['world_size']}; "
        f"ranks on the former spare(s) {spares}: {run.facts['spare_ranks_after']}",
    )
    return start


#: The straggler scenario slows a node once this step is logged: early, so that a short job has steps left for the
#: detection (straggler.steps slow steps of the last 2 x steps - 1) and the spare, and late enough for two normal
#: steps to compare with.
STRAGGLER_FROM_STEP = 3


def inject_straggler(run: ScenarioRun) -> None:
    """From step STRAGGLER_FROM_STEP on, a training node (not rank 0's) of a fixed-size job runs at a third of its
    speed (its processes stopped 0.2 s of every 0.3 s) while a hot spare waits; the slowdown goes on until the node
    is out of the job (its agent gone) or the job has trained again after it. Records the slow node, its ranks and
    the ranks the spare hosts afterwards."""
    run.cluster.start_all()
    run.wait_step(STRAGGLER_FROM_STEP)
    c = run.cluster
    spares, victim = spares_and_a_victim(run)
    run.facts["spare_nodes"], run.facts["slow_node"] = spares, victim
    run.facts["slow_ranks"] = [r for r in range(run.cfg.world) if c.node_of_rank(r) == victim]
    slow = c.slow_node(victim)
    took_over = None
    try:
        took_over = _record_spare_takeover(run, spares)
    finally:
        run.facts["slow_cycles"] = slow.stop()
        # The job re-formed without the slow node when the spare's attempt started: the steps from there on are
        # the take-over's (as on Slurm), even though the duty cycle is stopped only once the harness saw one.
        run.facts["slow_until"] = took_over["time"] if took_over else time.time()


def inject_straggler_in_place(run: ScenarioRun) -> None:
    """The straggler scenario's slowdown in a ``failover.in_place`` job: once the slow node is taken out only its
    workers stop, the spare's workers join the survivors' epoch in its ranks. Notes every node's worker pids before
    the slowdown and once the job logged its recovery (``facts["in_place_kill"]``, as a lost node's scenarios do,
    for :func:`check_survivors_kept_after_node_loss`)."""
    _needs_etcd(run, "straggler-in-place (its membership board is on etcd)")
    c = run.cluster
    c.start_all()
    run.wait_step(STRAGGLER_FROM_STEP)
    spares, victim = spares_and_a_victim(run)
    run.facts["spare_nodes"], run.facts["slow_node"] = spares, victim
    run.facts["slow_ranks"] = [r for r in range(run.cfg.world) if c.node_of_rank(r) == victim]
    nodes = sorted({n.index for n in c.alive()})
    before = {i: c.workers(i) for i in nodes}
    slow = c.slow_node(victim)
    t_fault = c.events[-1]["time"]
    recovered = None
    try:
        run.wait_for(
            lambda: any(r.get("event") == "in_place" and r["time"] > t_fault for r in run.records()),
            "the survivors' in-place recovery with the spare",
        )
        recovered = next(r for r in run.records() if r.get("event") == "in_place" and r["time"] > t_fault)
        first_after = run.wait_step(recovered["resumed_from"] + 1, after=recovered["time"])
    finally:
        run.facts["slow_cycles"] = slow.stop()
        run.facts["slow_until"] = recovered["time"] if recovered else time.time()
    after = {i: c.workers(i) for i in nodes if i != victim}
    run.facts["spare_ranks_after"] = [r for r in range(run.cfg.world) if c.node_of_rank(r) in spares]
    c.event(
        "observed",
        None,
        f"step {first_after['step']} at world {first_after['world_size']} after the in-place recovery; ranks on "
        f"the former spare(s) {spares}: {run.facts['spare_ranks_after']}",
    )
    run.facts["in_place_kill"] = {"pids": before[victim], "node": victim, "new_nodes": spares}
    run.facts["in_place_kill"] |= {"before": before, "after": after}
    run.facts["memory_interval"] = run.cfg.memory_interval


def inject_silent_node_during_save(run: ScenarioRun) -> None:
    """A worker stops itself (SIGSTOP) as the checkpoint write of ``save_stop_step`` starts
    (``--fault.stop_in_save_at_step``); the harness then stops its node's agent and other workers too: a whole
    node silent in the middle of a save, with a hot spare waiting. Once the job trains again the stopped node is
    fenced (SIGKILL)."""
    c = run.cluster
    c.start_all()
    step = save_stop_step(run.cfg)
    needle = f"stops itself (SIGSTOP) in the checkpoint save of step {step}"
    run.wait_for(
        lambda: any(needle in ln for _, _, ln in c.log_lines()), f"the stop in the save of step {step}", poll=0.05
    )
    marker = run.out / f".fault-save-stop-step{step}"
    pid = int(marker.read_text()) if marker.exists() else None
    node = next((n.index for n in c.alive() if pid in c.workers(n.index)), None)
    if node is None:
        raise ScenarioFailed(f"the worker that stopped itself (pid {pid}) is on no running node")
    _, spares = training_and_spares(run)
    # its worker is stopped already (node_of_rank skips stopped workers): its ranks are read from the node itself
    run.facts.update(
        silent_ranks=sorted(r for p in c.workers(node) if (r := c.rank_of(p)) is not None),
        spare_nodes=spares,
        killed_node=node,
        save_stop_step=step,
        silent_agent_pid=c.current(node).proc.pid,
    )
    c.stop_node(node)
    _record_spare_takeover(run, spares)
    c.kill_node(node, record=False)  # fence the silent machine


def save_stop_step(cfg: LocalChaosConfig) -> int:
    """The first storage checkpoint after the kill step."""
    return cfg.interval * -(-(cfg.kill_step + 1) // cfg.interval)


def inject_first_node_kill(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    first = run.cluster.node_of_rank(0)
    if first is None:
        raise ScenarioFailed("could not find the node running rank 0")
    run.facts["rank0_node"] = first
    run.cluster.kill_node(first)
    run.facts["killed_node"] = run.cluster.events[-1]["node"]
    # A fixed-size job (MIN = MAX) waits for a replacement, as Slurm requeue / a Kubernetes pod restart
    # would provide; the store is not on any node, so the survivors never lose the rendezvous.
    run.cluster.start_node(first, kind="replace")


def inject_node_pair_loss(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    # The replica ring runs over rank order: ring node k (ranks k*nproc..) keeps ring node k-1's snapshot.
    # Ring nodes 1 and 2: adjacent, and neither hosts rank 0 (that is first-node-kill's case).
    pair = [run.cluster.node_of_rank(k * run.cfg.nproc_per_node) for k in (1, 2)]
    if None in pair:
        raise ScenarioFailed(f"could not find the nodes of ring positions 1 and 2: {pair}")
    run.facts["killed_nodes"] = pair
    run.cluster.kill_nodes(pair)  # one fault, both at once
    for i in pair:
        run.cluster.start_node(i, kind="replace")


def inject_kill_mid_snapshot(run: ScenarioRun) -> None:
    """The worker kills itself from inside the copy (``--fault.kill_in_snapshot_at_step``, set by the
    scenario's flags): the harness records the fault once the worker said so and its process is gone."""
    if not run.cfg.memory_interval:
        raise ScenarioFailed("in-memory snapshots are off (--memory-interval 0): there is no copy to kill")
    run.cluster.start_all()
    step = snapshot_kill_step(run.cfg)
    needle = f"halfway through the memory snapshot of step {step}"
    t, line = run.wait_for(
        lambda: next(((t, ln) for t, _, ln in run.cluster.log_lines() if needle in ln), None),
        f"the kill in the copy of step {step}",
        poll=0.05,
    )
    marker = run.out / f".fault-snapshot-kill-step{step}"
    pid = int(marker.read_text()) if marker.exists() else None
    gone, how = confirm(pid, signal.SIGKILL) if pid else (False, f"no marker {marker.name}")
    node = run.cluster.node_of_rank(run.cfg.world - 1)
    run.facts["snapshot_kill_step"] = step
    run.facts["memory_interval"] = run.cfg.memory_interval
    run.cluster.event(
        "fault",
        node,
        f"worker pid {pid} SIGKILLed itself copying the snapshot of step {step}",
        label="SIGKILL mid-copy",
        t=t,
        confirmed=gone,
        evidence=f"{line.strip()}; {how}",
    )


def snapshot_kill_step(cfg: LocalChaosConfig) -> int:
    """The first snapshot step at or after the kill step."""
    m = cfg.memory_interval or 1
    return m * -(-cfg.kill_step // m)


def inject_preemption(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    run.cluster.signal_everything(signal.SIGTERM)
    first_gen = list(run.cluster.nodes)
    limit = run.cluster.launch.shutdown_timeout_s + 60
    codes = run.cluster.wait_exit(timeout=limit)
    if any(c is None for c in codes.values()):
        raise ScenarioFailed(f"agents still running {limit} s after SIGTERM")
    run.facts["first_launch_exit_codes"] = [n.proc.returncode for n in first_gen]
    run.cluster.event("exited", None, f"exit codes {codes}; relaunching")
    run.cluster.relaunch(f"{run.cluster.launch.rdzv_id}-r1")


def inject_hang(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    run.cluster.signal_worker(_victim(run), signal.SIGSTOP)


def inject_wedged_rank(run: ScenarioRun) -> None:
    """The last rank blocks its own main thread at the start of ``wedge_step``'s forward pass
    (``--fault.wedge_at_step``): the harness records the fault once the worker said so, with its process alive
    and not stopped (its heartbeat thread beats on: only its progress tells)."""
    c, cfg = run.cluster, run.cfg
    c.start_all()
    step, rank = wedge_step(cfg), cfg.world - 1
    needle = f"blocks its main thread at the start of step {step}'s forward pass"
    t, line = run.wait_for(
        lambda: next(((t, ln) for t, _, ln in c.log_lines() if needle in ln), None),
        f"the wedge at step {step}",
        poll=0.05,
    )
    marker = run.out / f".fault-wedge-step{step}"
    pid = int(marker.read_text()) if marker.exists() else None
    states = []
    for _ in range(3):  # alive and running on over a second: not stopped, not gone
        states.append(process_state(pid) if pid else None)
        time.sleep(0.3)
    alive = bool(states) and all(s is not None and s not in ("T", "t", "Z", "X") for s in states)
    node = next((n.index for n in c.alive() if pid in c.workers(n.index)), None)
    run.facts["wedge"] = {"step": step, "rank": rank, "pid": pid, "time": t}
    c.event(
        "fault",
        node,
        f"worker pid {pid} (rank {rank}) blocked its main thread at step {step}",
        label="wedged main thread",
        t=t,
        confirmed=alive,
        evidence=f"{line.strip()}; pid {pid} states over 0.9 s {states} (alive, not stopped)",
    )


def wedge_step(cfg: LocalChaosConfig) -> int:
    """wedged-rank's step: mid checkpoint interval, as the other faults."""
    return cfg.kill_step


def inject_kill_during_save(run: ScenarioRun) -> None:
    cfg = run.cfg
    run.cluster.start_all()
    target = 2 * cfg.interval  # first checkpoint after the kill step
    d = run.ckpt / f"step_{target:08d}"

    def in_flight():  # data (and DCP's .metadata) written, commit marker not yet
        return d.is_dir() and (d / ".metadata").exists() and not (d / MARKER).exists()

    run.wait_for(in_flight, f"the async checkpoint of step {target} to be written but not committed", poll=0.05)
    run.cluster.signal_worker(run.cluster.node_of_rank(0), signal.SIGKILL, rank=0)
    run.facts["partial_checkpoint"] = d.name
    partial = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    run.cluster.event("observed", None, f"{d.name} held {partial} without {MARKER} at the kill")


def inject_corrupt_checkpoint(run: ScenarioRun) -> None:
    cfg = run.cfg
    run.cluster.start_all()
    target = 2 * cfg.interval
    run.wait_for(
        lambda: any(r.get("event") == "checkpoint" and r["step"] == target for r in run.records()),
        f"the checkpoint of step {target} to be committed",
        poll=0.05,
    )
    d = run.ckpt / f"step_{target:08d}"
    shard = max((p for p in d.glob("*.distcp")), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    run.facts["corrupt_checkpoint"] = d.name
    run.facts["truncated"] = {"file": f"{d.name}/{shard.name}", "from": size, "to": shard.stat().st_size}
    run.cluster.event("corrupt", None, f"truncated {d.name}/{shard.name} from {size} to {size // 2} bytes")
    run.cluster.signal_worker(_victim(run), signal.SIGKILL)


FLIPPED_BYTES = 64  # how much of a snapshot corrupt-snapshot damages (inverted in place, as failing memory would)


def damage_generations(mem: Path, prefix: str, *, newest_only: bool = False) -> list[dict]:
    """Invert FLIPPED_BYTES in the middle of each complete in-memory generation named `prefix` (``own-r1-w2``,
    ``peer-r1-w2``) under a node's memory directory (only the one its ``.current`` names, with `newest_only`).
    Returns one record per generation: its file, step and offset, and the CRC32C its metadata holds vs that of
    its bytes now (the proof that the damage is there)."""
    import torch
    from training.checkpoint.integrity import crc32c_bytes

    done = []
    for current in sorted(mem.glob(f"*/{prefix}.current")):
        slots = [json.loads(current.read_text())["slot"]] if newest_only else [0, 1]
        for slot in slots:
            meta_file, data_file = (current.with_name(f"{prefix}.{slot}.{x}") for x in ("meta", "data"))
            if not meta_file.exists():  # a copy in progress: not a generation anyone would restore
                continue
            meta = torch.load(meta_file, weights_only=True)
            at = meta["nbytes"] // 2
            with open(data_file, "r+b") as f:
                f.seek(at)
                good = f.read(FLIPPED_BYTES)
                f.seek(at)
                f.write(bytes(b ^ 0xFF for b in good))
            now = crc32c_bytes(data_file.read_bytes()[: meta["nbytes"]])
            done.append(
                {
                    "file": str(data_file),
                    "step": int(meta["step"]),
                    "offset": at,
                    "bytes": len(good),
                    "crc32c": meta.get("crc32c"),
                    "now": now,
                }
            )
    return done


def _newest(mem: Path, prefix: str) -> int | None:
    """The step of the newest complete generation `prefix` in a node's memory directory (its ``.current``)."""
    for current in mem.glob(f"*/{prefix}.current"):
        try:
            return int(json.loads(current.read_text())["step"])
        except (OSError, ValueError, KeyError):
            return None
    return None


def _freeze_replicated(run: ScenarioRun, rank: int, at_least: int) -> tuple[int, int, int]:
    """SIGSTOP `rank`'s worker at a moment its newest own-node snapshot (of a step >= `at_least` that no storage
    checkpoint can hold: not a multiple of the interval) is also its peer's replica, so that its shard of that
    step can only come from the replica once the own copy is damaged. Should the worker publish a newer snapshot
    between the look and the stop, it is continued and the wait starts over. Returns (node, pid, step)."""
    c, cfg = run.cluster, run.cfg
    world, nproc = cfg.world, cfg.nproc_per_node
    for _ in range(50):
        # (node,): node 0 is a node, not a falsy answer to wait for
        (node,) = run.wait_for(lambda: _some(c.node_of_rank(rank)), f"a running worker of rank {rank}")
        (peer,) = run.wait_for(lambda: _some(c.node_of_rank((rank + nproc) % world)), "the node keeping its replica")

        def in_place(node: int = node, peer: int = peer) -> int | None:  # this iteration's nodes
            own = _newest(c.node_memory(node), f"own-r{rank}-w{world}")
            kept = _newest(c.node_memory(peer), f"peer-r{rank}-w{world}")
            ok = own is not None and own == kept and own >= at_least and own % cfg.interval
            return own if ok else None

        run.wait_for(in_place, f"rank {rank}'s snapshot of a step >= {at_least} on its node and its peer's", poll=0.02)
        pid = next((p for p in c.workers(node) if c.rank_of(p) == rank), None)
        if pid is None:
            continue
        os.kill(pid, signal.SIGSTOP)
        confirm(pid, signal.SIGSTOP)
        step = in_place()
        if step is not None:
            return node, pid, step
        os.kill(pid, signal.SIGCONT)  # it moved on in between: look again
    raise ScenarioFailed(f"rank {rank}'s newest snapshot was never also its peer's replica at a stop")


def _some(x):
    return None if x is None else (x,)


def _damage_then_kill(run: ScenarioRun, *, at_least: int, replica: bool) -> dict:
    """Freeze the last rank's worker (_freeze_replicated), damage its newest own-node snapshot (with `replica`:
    every generation of its shard, own copies and the peer's replicas, on every node), then SIGKILL it."""
    c, cfg = run.cluster, run.cfg
    rank = cfg.world - 1
    node, pid, step = _freeze_replicated(run, rank, at_least)
    t = time.time()
    if replica:
        damaged = [
            d
            for i in sorted({n.index for n in c.nodes})
            for kind in ("own", "peer")
            for d in damage_generations(c.node_memory(i), f"{kind}-r{rank}-w{cfg.world}")
        ]
    else:
        damaged = damage_generations(c.node_memory(node), f"own-r{rank}-w{cfg.world}", newest_only=True)
    os.kill(pid, signal.SIGKILL)
    gone, how = confirm(pid, signal.SIGKILL)
    shown = all(d["now"] != d["crc32c"] for d in damaged)
    what = "its own-node copy and its replica (every generation)" if replica else "its newest own-node copy"
    c.event(
        "fault",
        node,
        f"worker pid {pid} (rank {rank}) frozen at step {step}; {FLIPPED_BYTES} bytes of {what} "
        f"inverted ({len(damaged)} generation(s)); SIGKILL",
        label="damaged snapshot + SIGKILL" + (" (own + replica)" if replica else ""),
        t=t,
        confirmed=bool(damaged) and shown and gone,
        evidence="; ".join(
            f"{Path(d['file']).name} step {d['step']}: CRC32C recorded {d['crc32c']}, now {d['now']}" for d in damaged
        )
        + f"; {how}",
    )
    return {
        "rank": rank,
        "step": step,
        "replica": replica,
        "time": t,
        "damaged": [(Path(d["file"]).name.split("-r", 1)[0], d["step"]) for d in damaged],
    }


def second_damage_step(cfg: LocalChaosConfig) -> int:
    """corrupt-snapshot's second fault: past the storage checkpoint at 2 x interval, which it falls back to."""
    return 2 * cfg.interval + 1


def inject_corrupt_snapshot(run: ScenarioRun) -> None:
    """Two faults, each on the last rank, frozen with its newest snapshot replicated, damaged, then SIGKILLed:
    first its own-node copy only (the peer's replica must be restored), later, once the job trains again and has
    committed the checkpoint of 2 x interval, every generation of its shard, own and replica (storage must be)."""
    if not run.cfg.memory_interval:
        raise ScenarioFailed("in-memory snapshots are off (--memory-interval 0): there is no snapshot to damage")
    run.cluster.start_all()
    first = _damage_then_kill(run, at_least=run.cfg.kill_step, replica=False)
    store = 2 * run.cfg.interval
    run.wait_start_after(first["time"])
    run.wait_for(
        lambda: any(r.get("event") == "checkpoint" and r["step"] == store for r in run.records()),
        f"the checkpoint of step {store} to be committed",
    )
    second = _damage_then_kill(run, at_least=second_damage_step(run.cfg), replica=True)
    run.facts["snapshot_damage"] = [first, second]


def inject_restarts_exhausted(run: ScenarioRun) -> None:
    run.start_until_kill_step()
    victim = _victim(run)
    killed: list[int] = []
    t_last = 0.0
    for i in range(run.cluster.launch.max_restarts + 1):
        if i:  # kill each new incarnation once it is up (process group formed, checkpoint loaded)
            run.wait_start_after(t_last)
        pid = run.wait_for(
            lambda: next((p for p in run.cluster.workers(victim) if p not in killed), None),
            "a new worker on the victim node",
        )
        run.cluster.signal_worker(victim, signal.SIGKILL)
        killed.append(pid)
        t_last = run.cluster.events[-1]["time"]
    run.facts["max_restarts"] = run.cluster.launch.max_restarts


def _needs_etcd(run: ScenarioRun, what: str = "the store-* scenarios") -> None:
    if run.cfg.coordinator != "etcd":
        raise ScenarioFailed(f"{what} need the etcd coordinator (--coordinator etcd, the default)")


def inject_worker_kill_in_place(run: ScenarioRun) -> None:
    """SIGKILL one worker of a ``failover.in_place`` job: its agent reports it gone and starts it again alone, the
    other workers recover in their processes. Notes every node's worker pids before the kill and once the job
    logged its recovery (``in_place``), for :func:`check_survivors_kept_in_place`."""
    _needs_etcd(run, "worker-kill-in-place (its membership board is on etcd)")
    run.start_until_kill_step()
    nodes = range(run.cfg.nodes)
    before = {i: run.cluster.workers(i) for i in nodes}
    victim = _victim(run)
    killed = run.cluster.signal_worker(victim, signal.SIGKILL)
    t_kill = run.cluster.events[-1]["time"]
    run.wait_for(
        lambda: any(r.get("event") == "in_place" and r["time"] > t_kill for r in run.records()),
        "the survivors' in-place recovery",
    )
    after = {i: run.cluster.workers(i) for i in nodes}
    run.facts["in_place_kill"] = {"pid": killed, "node": victim, "before": before, "after": after}
    run.facts["memory_interval"] = run.cfg.memory_interval


def _lose_a_node_in_place(
    run: ScenarioRun, scenario: str, lose: Callable[[int], None], *, fence: bool, rank0: bool = False
) -> tuple[list[int], int]:
    """Take a training node of a ``failover.in_place`` job out with ``lose(node)`` while a hot spare waits (rank 0's
    when ``rank0``, else the last one besides it), wait for the job's ``in_place`` record, fence the node (SIGKILL,
    memory wiped) when ``fence``, and note every node's worker pids before and after (``facts["in_place_kill"]``).
    Returns (the spares, the node lost)."""
    _needs_etcd(run, f"{scenario} (its membership board is on etcd)")
    run.start_until_kill_step()
    c = run.cluster
    spares, victim = spares_and_rank0s_node(run) if rank0 else spares_and_a_victim(run)
    nodes = sorted({n.index for n in c.alive()})
    before = {i: c.workers(i) for i in nodes}
    lose(victim)
    t_fault = c.events[-1]["time"]
    run.wait_for(
        lambda: any(r.get("event") == "in_place" and r["time"] > t_fault for r in run.records()),
        "the survivors' in-place recovery with the spare",
    )
    if fence:
        c.kill_node(victim, record=False)
    after = {i: c.workers(i) for i in nodes if i != victim}
    run.facts["in_place_kill"] = {"pids": before[victim], "node": victim, "new_nodes": spares}
    run.facts["in_place_kill"] |= {"before": before, "after": after}
    run.facts["memory_interval"] = run.cfg.memory_interval
    return spares, victim


def inject_node_kill_in_place(run: ScenarioRun) -> None:
    """SIGKILL a training node (not rank 0's) of a ``failover.in_place`` job while a hot spare waits: the round
    that replaces it keeps the survivors' workers running, the spare's workers join their epoch in the lost ranks.
    Notes every node's worker pids before the kill and once the job logged its recovery, for
    :func:`check_survivors_kept_after_node_loss`."""
    spares, victim = _lose_a_node_in_place(run, "node-kill-in-place", run.cluster.kill_node, fence=False)
    run.facts["spare_nodes"], run.facts["killed_node"] = spares, victim


def inject_first_node_kill_in_place(run: ScenarioRun) -> None:
    """SIGKILL the node running rank 0 of a ``failover.in_place`` job while a hot spare waits: its agent served the
    round's store, and the spare that takes node rank 0 serves it now; the survivors' agents move to it without
    stopping their workers, the spare's workers join the survivors' epoch in the lost ranks (rank 0 among them).
    Notes the pids for :func:`check_survivors_kept_after_node_loss` and :func:`check_rank0_joined_in_place`."""
    spares, victim = _lose_a_node_in_place(
        run, "first-node-kill-in-place", run.cluster.kill_node, fence=False, rank0=True
    )
    run.facts["spare_nodes"], run.facts["killed_node"] = spares, victim
    run.facts["run_lock_holder"] = _run_lock_holder(run.ckpt)


def _run_lock_holder(ckpt: Path) -> int | None:
    """The pid the run lock's file names, read once the job recovered (training.checkpoint.run_lock), or None."""
    try:
        return int(json.loads((ckpt / LOCK_NAME).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def inject_silent_node_in_place(run: ScenarioRun) -> None:
    """SIGSTOP a training node (not rank 0's) of a ``failover.in_place`` job while a hot spare waits: once its
    membership lease ends, the spare's workers take its ranks and join the survivors' epoch, and a survivor's worker
    left blocked in a collective with the silent node cuts its group at its agent's request and recovers in its
    process: the group never restarts. The stopped node is fenced (SIGKILLed, memory wiped) once the job recovered, as a
    cluster's health system would. Notes the pids for :func:`check_silent_node_replaced_in_place`."""
    _lose_a_node_in_place(run, "silent-node-in-place", run.cluster.stop_node, fence=True)


def inject_store_member_kill(run: ScenarioRun) -> None:
    """SIGKILL the etcd member that leads, mid-training; it stays down (the job finishes on two)."""
    _needs_etcd(run)
    run.start_until_kill_step()
    etcd = run.cluster.etcd
    leader = etcd.leader()
    pid = leader.process.pid
    etcd.kill(leader)
    new = etcd.leader_within(10.0)
    run.facts["store_killed"] = {"member": leader.name, "pid": pid, "new_leader": new.name if new else None}
    run.cluster.event(
        "fault",
        None,
        f"SIGKILL etcd leader {leader.name} (pid {pid})",
        label="store-member-kill",
        confirmed=leader.process.poll() is not None,
        evidence=f"member {leader.name} pid {pid} exit {leader.process.returncode}; new leader "
        f"{new.name if new else 'none within 10 s'}",
    )


def _stop_store(run: ScenarioRun, *, as_fault: bool = True) -> float:
    """SIGSTOP every etcd member (a store that does not answer, its sockets open); returns when. ``as_fault``
    False: the outage is the setting of another fault, recorded as a plain event (no restart expected of it)."""
    states = run.cluster.etcd.pause()
    run.facts["store_stopped_states"] = states
    run.cluster.event(
        "fault" if as_fault else "store-down",
        None,
        f"SIGSTOP every etcd member for {run.cfg.store_outage_s:g} s",
        label="store-outage",
        confirmed=all(v == "T" for v in states.values()),
        evidence=f"member states {states}",
    )
    return run.cluster.events[-1]["time"]


def _resume_store(run: ScenarioRun) -> float:
    run.cluster.etcd.resume()
    run.cluster.event("store-back", None, "SIGCONT every etcd member")
    return run.cluster.events[-1]["time"]


def inject_store_outage(run: ScenarioRun) -> None:
    _needs_etcd(run)
    run.start_until_kill_step()
    t_stop = _stop_store(run)
    try:
        time.sleep(run.cfg.store_outage_s)
    finally:
        t_back = _resume_store(run)
    run.facts["store_outage"] = (t_stop, t_back)


def inject_store_outage_then_worker_kill(run: ScenarioRun) -> None:
    _needs_etcd(run)
    run.start_until_kill_step()
    t_stop = _stop_store(run, as_fault=False)
    try:
        time.sleep(min(5.0, run.cfg.store_outage_s / 4))
        run.cluster.signal_worker(_victim(run), signal.SIGKILL)
        time.sleep(max(0.0, t_stop + run.cfg.store_outage_s - time.time()))
    finally:
        t_back = _resume_store(run)
    run.facts["store_outage"] = (t_stop, t_back)


# ------------------------------------------------------------------------------------------ checks
# Scenario-specific checks: pure functions of the observation (see the module docstring).
def _restarted_attempts(obs: Observation) -> list:
    t0 = obs.faults[0].time if obs.faults else float("inf")
    return [a for a in split_attempts(obs.records) if a.start["time"] > t0]


def _rounds_formed(obs: Observation) -> list[str]:
    return [ln.split("[rendezvous] round ", 1)[1].split(":")[0] for ln in obs.log_has("[rendezvous] round ")]


def _pids(lists) -> set[int]:
    return {int(p) for ps in lists for p in ps}


def _in_place_evidence(obs: Observation) -> tuple[dict | None, list[dict], int]:
    """The pids the harness noted (``facts["in_place_kill"]``), the ``in_place`` records after the fault and the
    job's attempts."""
    t0 = obs.faults[0].time if obs.faults else float("inf")
    recovered = [r for r in obs.records if r.get("event") == "in_place" and r["time"] > t0]
    return obs.facts.get("in_place_kill"), recovered, len(split_attempts(obs.records))


def check_survivors_kept_in_place(obs: Observation) -> Check:
    """worker-kill-in-place: the job recovered in place (one attempt, one ``in_place`` record after the kill), every
    worker but the killed one has the pid it had before the kill, and exactly one new worker runs, on the killed
    worker's node (``facts["in_place_kill"]``: the pids before and after, the killed pid and its node). With more
    than one worker a node, gloo can leave a survivor blocked on survivors that left for the next epoch: one its own
    agent killed as blocked (its line after the kill names its pid) is replaced alone too, and counted apart."""
    name = "survivors kept their processes, one worker replaced"
    seen, recovered, attempts = _in_place_evidence(obs)
    if not seen:
        return Check(name, False, f"no pids noted; {len(recovered)} in-place recovery(ies), {attempts} attempt(s)")
    before, after = _pids(seen["before"].values()), _pids(seen["after"].values())
    survivors, new = before - {seen["pid"]}, after - before
    blocked = _killed_as_blocked(obs, survivors)
    # nodes by index (local, the emulator's pods) or host name (Slurm); a report read back from JSON has str keys
    node_of = {p: str(node) for side in ("before", "after") for node, ps in seen[side].items() for p in ps}
    replaced_on = sorted(node_of[p] for p in {seen["pid"], *blocked})  # each replaced on its own node
    ok = len(recovered) == 1 and attempts == 1 and survivors - blocked <= after and not blocked & after
    ok = ok and sorted(node_of[p] for p in new) == replaced_on
    return Check(
        name,
        ok,
        f"before the kill {sorted(before)}, killed {seen['pid']} (node{seen['node']}), after {sorted(after)}: "
        f"survivors kept {sorted(survivors & after)} of {sorted(survivors)}"
        + (f", killed as blocked by their agents {sorted(blocked)}" if blocked else "")
        + f", new {sorted(new)}; "
        f"{len(recovered)} in-place recovery(ies), {attempts} attempt(s) (a group restart starts another)",
    )


#: The end of what an in-place agent says when it killed a worker of its node left blocked in a collective (by peers
#: that left for the next epoch, or by a lost node): :mod:`training.launch.inplace_agent`.
BLOCKED_KILLED = "(blocked in a collective its backend cannot cut): killed, to be replaced"


def _killed_as_blocked(obs: Observation, pids: set[int]) -> set[int]:
    """Those of ``pids`` that their agent said it killed as blocked, after the fault."""
    t0 = obs.faults[0].time if obs.faults else float("inf")
    return {p for p in pids for t, line in obs.logs if t > t0 and BLOCKED_KILLED in line and f"(pid {p})" in line}


def check_survivors_kept_after_node_loss(obs: Observation) -> Check:
    """node-kill-in-place: one attempt and one ``in_place`` record after the kill, every worker of the surviving
    nodes has the pid it had before, and as many new workers as the lost node had run, all on the spare(s)
    (``facts["in_place_kill"]``: ``pids`` of the lost node, ``new_nodes`` where the new workers must be)."""
    name = "survivors kept their processes, the lost node's ranks taken by the spare's workers"
    seen, recovered, attempts = _in_place_evidence(obs)
    if not seen:
        return Check(name, False, f"no pids noted; {len(recovered)} in-place recovery(ies), {attempts} attempt(s)")
    lost = {int(p) for p in seen["pids"]}
    before, after = _pids(seen["before"].values()), _pids(seen["after"].values())
    survivors, new = before - lost, after - before
    on_spares = _pids(ps for node, ps in seen["after"].items() if str(node) in {str(n) for n in seen["new_nodes"]})
    ok = len(recovered) == 1 and attempts == 1 and bool(lost) and survivors <= after
    ok = ok and len(new) == len(lost) and new <= on_spares
    return Check(
        name,
        ok,
        f"before the kill {sorted(before)}, node{seen['node']} lost with {sorted(lost)}, after {sorted(after)}: "
        f"survivors kept {sorted(survivors & after)} of {sorted(survivors)}, new {sorted(new)} (on the spare(s) "
        f"{seen['new_nodes']}: {sorted(new & on_spares)}); {len(recovered)} in-place recovery(ies), {attempts} "
        f"attempt(s) (a group restart starts another)",
    )


def check_rank0_joined_in_place(obs: Observation) -> Check:
    """first-node-kill-in-place: the job's rank 0 after the kill is a worker that joined the running epoch (its
    ``in_place`` record says ``joined``) on a spare, and the survivors kept their ranks, so the shards of those that
    kept their processes did not move (the recovery's ``sources`` has ``live`` for each: no such survivor read its
    state back). A survivor its agent replaced as blocked by the lost node (gloo on a dead link: the Slurm lab's node
    kill takes the link down; its line names it) restores like any replacement."""
    name = "rank 0 taken by the spare's worker, the survivors' shards kept where they were"
    t0 = obs.faults[0].time if obs.faults else float("inf")
    rec = next((r for r in obs.records if r.get("event") == "in_place" and r["time"] > t0), None)
    if rec is None:
        return Check(name, False, "no in-place recovery after the kill")
    sources = list(rec.get("sources") or [])
    others = sources[1:]  # rank 0 is the joiner: every other rank a survivor in its old rank
    blocked = sum(1 for t, line in obs.logs if t > t0 and BLOCKED_KILL_LINE in line)
    live = sum(1 for s in others if s == "live")
    # the ranks rolled back a step (the lost rank's snapshot of the held step was in flight): every rank restores it
    agreed, resumed = rec.get("agreed_step"), rec.get("resumed_from")
    rolled_back = agreed is not None and resumed is not None and resumed < agreed
    kept = rolled_back or live >= len(others) - blocked
    ok = bool(rec.get("joined")) and sources[:1] != ["live"] and bool(others) and kept
    seen = obs.facts.get("in_place_kill") or {}
    new = _pids((seen.get("after") or {}).values()) - _pids((seen.get("before") or {}).values())
    holder = obs.facts.get("run_lock_holder", "not read")
    if holder != "not read":  # the local harness reads it: the new rank 0 (a new process) holds the run lock
        ok = ok and holder in new
    return Check(
        name,
        ok,
        f"the recovery's record (epoch {rec.get('epoch')}, world {rec.get('world_size')}): written by a joiner: "
        f"{bool(rec.get('joined'))}; each rank's state from {sources} (live: kept in the process; survivors "
        f"replaced as blocked: {blocked}"
        + (f"; rolled back from step {agreed} to {resumed}: every rank restored it" if rolled_back else "")
        + ")"
        + ("" if holder == "not read" else f"; the run lock held by pid {holder} (new workers {sorted(new)})"),
    )


#: What a survivor's agent says when it killed a worker of its node left blocked by a lost node (inplace_agent).
BLOCKED_KILL_LINE = "after a node was lost (blocked in a collective its backend cannot cut): killed, to be replaced"


def check_silent_node_replaced_in_place(obs: Observation) -> Check:
    """silent-node-in-place: one attempt and an ``in_place`` record after the stop; the silent node's ranks were
    taken by as many new workers on the spare(s); every worker of the surviving nodes either kept its pid or was
    killed by its own agent as blocked by the lost node (its line names the pid) and replaced alone on its node."""
    name = "the lost node's ranks taken by the spare's workers, the survivors kept or replaced alone, no restart"
    seen, recovered, attempts = _in_place_evidence(obs)
    if not seen:
        return Check(name, False, f"no pids noted; {len(recovered)} in-place recovery(ies), {attempts} attempt(s)")
    t0 = obs.faults[0].time if obs.faults else float("inf")
    lost = {int(p) for p in seen["pids"]}
    before, after = _pids(seen["before"].values()), _pids(seen["after"].values())
    survivors, new = before - lost, after - before
    killed = {
        p for p in survivors for t, line in obs.logs if t > t0 and BLOCKED_KILL_LINE in line and f"(pid {p})" in line
    }
    on_spares = _pids(ps for node, ps in seen["after"].items() if str(node) in {str(n) for n in seen["new_nodes"]})
    ok = bool(recovered) and attempts == 1 and bool(lost) and survivors - killed <= after and not killed & after
    ok = ok and len(new & on_spares) == len(lost) and len(new) == len(lost) + len(killed)
    return Check(
        name,
        ok,
        f"before the fault {sorted(before)}, node {seen['node']} lost (silent or dead) with {sorted(lost)}, "
        f"after {sorted(after)}: "
        f"survivors kept {sorted(survivors & after)} of {sorted(survivors)}, killed as blocked {sorted(killed)}, "
        f"new {sorted(new)} (on the spare(s) {seen['new_nodes']}: {sorted(new & on_spares)}); {len(recovered)} "
        f"in-place record(s), {attempts} attempt(s) (a group restart starts another)",
    )


#: What a survivor's worker says when it cut its group at its agent's request (training.job.inplace.group).
CUT_LINE = "cut its group at its agent's request"


def check_blocked_survivors_cut_in_place(obs: Observation) -> Check:
    """silent-node-in-place: the survivors' collective blocked on the silent node was cut in their processes (a
    worker's ``cut its group`` line after the stop) and every survivor kept its pid: none was killed as blocked
    (the agent's fall-back when a cut does not end the collective)."""
    name = "the survivors' blocked collective cut in their processes, every survivor's pid kept"
    seen = obs.facts.get("in_place_kill")
    if not seen:
        return Check(name, False, "no pids noted")
    t0 = obs.faults[0].time if obs.faults else float("inf")
    before, after = _pids(seen["before"].values()), _pids(seen["after"].values())
    survivors = before - {int(p) for p in seen["pids"]}
    cuts = [line for t, line in obs.logs if t > t0 and CUT_LINE in line]
    killed = [line for t, line in obs.logs if t > t0 and BLOCKED_KILL_LINE in line]
    ok = bool(cuts) and bool(survivors) and survivors <= after and not killed
    return Check(
        name,
        ok,
        f"{len(cuts)} cut(s) said after the stop{': ' + cuts[0].split('[inplace] ', 1)[-1][:140] if cuts else ''}; "
        f"survivors {sorted(survivors)}, still running {sorted(survivors & after)}; killed as blocked: {len(killed)}",
    )


#: What a survivor's agent says when it took a dead node out before its lease's TTL (rendezvous handler's line).
TAKEN_OUT_LINE = "refuses connections; its membership lease revoked"


def check_recomputed_in_place(obs: Observation) -> Check:
    """worker-kill-in-place: the survivors resumed at most ``memory_interval`` steps before the step they held, and
    trained on from there; the detail gives the kill -> survivors' next step time (the issue's <= 1.0 s target)."""
    bound = obs.facts.get("memory_interval", 1)
    name = f"steps recomputed in place <= {bound}"
    t0 = obs.faults[0].time if obs.faults else float("inf")
    rec = next((r for r in obs.records if r.get("event") == "in_place" and r["time"] > t0), None)
    if rec is None:
        return Check(name, False, "no in-place recovery after the fault")
    after = [r for r in obs.records if r.get("event") == "step" and r["time"] > rec["time"]]
    held = held_before(rec, obs.records, t0)  # a joiner's record (rank 0 replaced) holds no step of its own
    redone = held - rec["resumed_from"]
    ok = 0 <= redone <= bound and bool(after) and after[0]["step"] == rec["resumed_from"] + 1
    took = f"{after[0]['time'] - t0:.2f} s" if after else "never"
    out = [t for t, line in obs.logs if t > t0 and TAKEN_OUT_LINE in line]  # training.launch.rendezvous.dead_agent
    how = f"; the lost node taken out by a peer {out[0] - t0:.2f} s after the kill (its agent dead)" if out else ""
    return Check(
        name,
        ok,
        f"held step {held}, resumed from {rec['resumed_from']} ({redone} recomputed, state from "
        f"{(rec.get('restored_from') or {}).get('tier')}); kill -> survivors' next step {took} "
        f"({'rank 0 replaced too, its start' if rec.get('joined') else 'their recovery'} {rec['seconds']:.2f} s){how}",
    )


def check_no_new_round(obs: Observation) -> Check:
    """The store's fault cost the job nothing: one attempt, every agent in the first round only."""
    rounds_seen = sorted(set(_rounds_formed(obs)))
    attempts = split_attempts(obs.records)
    ok = rounds_seen == ["0"] and len(attempts) == 1 and bool(obs.faults)
    return Check(
        "no restart: the job trained through the store's fault",
        ok,
        f"rounds formed {rounds_seen or 'none'}; attempts {len(attempts)}; faults {len(obs.faults)}",
    )


def check_leader_replaced(obs: Observation) -> Check:
    """The member killed was the leader, and another member took over."""
    k = obs.facts.get("store_killed") or {}
    ok = bool(k) and k.get("new_leader") not in (None, k.get("member"))
    return Check(
        "etcd leader killed, another member leads",
        ok,
        f"killed {k.get('member', 'none')} (pid {k.get('pid', '-')}), new leader {k.get('new_leader')}",
    )


def _store_window(obs: Observation) -> tuple[float, float] | None:
    w = obs.facts.get("store_outage")
    return tuple(w) if w else None


def check_trained_through_outage(obs: Observation) -> Check:
    """Steps were logged while every member was stopped, and the agents said the store was unreachable."""
    w = _store_window(obs)
    during = [r for r in obs.records if r.get("event") == "step" and w and w[0] < r["time"] < w[1]]
    said = obs.log_has("membership store unreachable")
    ok = bool(w) and bool(during) and bool(said)
    return Check(
        "training went on with the store down",
        ok,
        f"outage {w[1] - w[0]:.1f} s, {len(during)} step(s) logged during it; 'unreachable' lines: {len(said)}"
        if w
        else "no outage recorded",
    )


def check_reformed_after_store_back(obs: Observation) -> Check:
    """The worker killed during the outage: the job re-formed once the store was back (the figure: seconds from
    the store back to the next attempt's first step)."""
    w = _store_window(obs)
    after = [a for a in _restarted_attempts(obs) if w and a.steps and a.steps[0]["time"] > w[0]]
    stopped = all(v == "T" for v in (obs.facts.get("store_stopped_states") or {"-": None}).values())
    ok = bool(w) and stopped and bool(after)
    first = after[0].steps[0]["time"] - w[1] if ok else None
    return Check(
        "re-formed once the store was back",
        ok,
        f"every member stopped {obs.facts.get('store_stopped_states')}; store back -> first step of the "
        f"next attempt: {first:.1f} s"
        if ok
        else f"members stopped: {obs.facts.get('store_stopped_states')}; no attempt trained after the fault",
    )


def check_shrank_and_grew(obs: Observation) -> Check:
    full, small = obs.facts["world"], obs.facts["world"] - obs.facts["nproc_per_node"]
    worlds = world_sizes(obs.records)
    ok = bool(obs.rejoins) and small in worlds and worlds[-1] == full
    return Check("shrank and grew back", ok, f"world sizes {worlds}, rejoin at {len(obs.rejoins)} time(s)")


SILENT_NODE_DECLARED = "silent node declared (its keep-alives or heartbeats stopped)"


def check_silent_node_declared(obs: Observation) -> Check:
    """After the stop, the job itself named the stopped node: a peer agent's lost-node line with its agent's
    pid (its etcd lease expired, :mod:`training.launch.rendezvous.handler`; ``[agent] lost node(s)`` in runs from
    before etcd), or a peer's heartbeat watchdog line with one of its ranks; not a collective timeout."""
    t = obs.faults[0].time if obs.faults else float("inf")
    ranks, agent = obs.facts.get("silent_ranks") or [], obs.facts.get("silent_agent_pid")
    lines = [ln for ln in obs.log_has("[watchdog]") if any(f": rank {r} (" in ln for r in ranks)]
    lines += [ln for ln in obs.log_has("[agent] lost node(s)") if agent and f"(agent pid {agent})" in ln]
    lines += [ln for ln in obs.log_has("[rendezvous] lost node(s)") if agent and f"-{agent}-" in ln]
    after = [a for a in _restarted_attempts(obs) if a.start["time"] > t]
    ok = bool(ranks) and bool(lines) and bool(after)
    said = (
        lines[0].strip()[:200]
        if lines
        else (f"no lost-node line naming agent pid {agent} and no watchdog line naming rank(s) {ranks}")
    )
    return Check(SILENT_NODE_DECLARED, ok, f"{said}; attempts after the stop: {len(after)}")


def check_spare_took_over(obs: Observation) -> Check:
    """A node that was a spare at the kill hosts ranks afterwards, and the world size never changed."""
    spares, killed = obs.facts.get("spare_nodes") or [], obs.facts.get("killed_node")
    ranks = obs.facts.get("spare_ranks_after") or []
    worlds = world_sizes(obs.records)
    again = [a for a in _restarted_attempts(obs) if a.steps]
    ok = bool(spares) and killed is not None and bool(ranks) and bool(again) and set(worlds) == {obs.facts["world"]}
    return Check(
        "hot spare took the lost node's place",
        ok,
        f"killed node{killed}; spare(s) {spares} host rank(s) {ranks} after the kill; world sizes {worlds}; "
        f"attempts that trained after the kill: {len(again)}",
    )


SPARE_REPLACED_STRAGGLER = "the straggler's node left, the hot spare took its place"


def check_spare_replaced_straggler(obs: Observation) -> Check:
    """The slow node's agent said it left the job, a node that was a spare hosts ranks afterwards, and the world
    size never changed."""
    spares, ranks = obs.facts.get("spare_nodes") or [], obs.facts.get("spare_ranks_after") or []
    left = obs.log_has("[agent] this node left the job")
    worlds = world_sizes(obs.records)
    again = [a for a in _restarted_attempts(obs) if a.steps]
    ok = bool(spares) and bool(ranks) and bool(left) and bool(again) and set(worlds) == {obs.facts["world"]}
    return Check(
        SPARE_REPLACED_STRAGGLER,
        ok,
        f"{left[0].strip()[:160] if left else 'no node said it left the job'}; spare(s) {spares} host "
        f"rank(s) {ranks} afterwards; world sizes {worlds}; attempts that trained after: {len(again)}",
    )


#: How a survivor's in-place record names a straggler's node leaving (training.job.failover.InPlace.peer_lost).
STRAGGLER_LEFT_FAILED = "a straggler's node left"


def check_straggler_left_in_place(obs: Observation) -> Check:
    """straggler-in-place: the slow node's agent said it left the job, and the survivors' ``in_place`` record after
    the slowdown says they recovered because a straggler's node left (not a lost peer)."""
    name = "the straggler's node left, the survivors recovered in place for it"
    t0 = obs.faults[0].time if obs.faults else float("inf")
    left = obs.log_has("[agent] this node left the job")
    rec = next((r for r in obs.records if r.get("event") == "in_place" and r["time"] > t0), None)
    why = (rec or {}).get("failed") or ""
    ok = bool(left) and why.startswith(STRAGGLER_LEFT_FAILED)
    return Check(
        name,
        ok,
        f"{left[0].strip()[:160] if left else 'no node said it left the job'}; the survivors' record: "
        f"{why[:160] if rec else 'none after the slowdown'}",
    )


def check_rank0_node_killed(obs: Observation) -> Check:
    """The killed node was the one running rank 0, and the job re-formed at full size on the same store."""
    killed, rank0 = obs.facts.get("killed_node"), obs.facts.get("rank0_node")
    again = [a for a in _restarted_attempts(obs) if a.steps and a.start.get("world_size") == obs.facts["world"]]
    store = obs.facts.get("store_alive_at_end")
    ok = killed is not None and killed == rank0 and bool(again) and bool(store)
    return Check(
        "rank 0's node killed, job re-formed on the membership store",
        ok,
        f"killed node{killed}, rank 0 was on node{rank0}; re-formed attempts at full size: {len(again)}; "
        f"store running at the end: {store}",
    )


def check_fell_back_to_storage(obs: Observation) -> Check:
    """Both lost nodes' memory went with them: the restart restored from storage, and said why."""
    after = _restarted_attempts(obs)
    got = (after[0].start.get("restored_from") or {}) if after else {}
    said = obs.log_has("no step complete for every shard")
    killed = obs.facts.get("killed_nodes") or []
    ok = len(killed) == 2 and got.get("tier") == "storage" and bool(said)
    return Check(
        "fell back to storage (a shard and its replica lost)",
        ok,
        f"nodes killed at once: {killed}; restored from {got or 'nothing'}; "
        f"log: {said[0].strip()[:160] if said else 'no reason given'}",
    )


def check_previous_snapshot_used(obs: Observation) -> Check:
    """The generation being written at the kill was never offered: the restart restored the step before it."""
    step = obs.facts.get("snapshot_kill_step")
    after = _restarted_attempts(obs)
    got = (after[0].start.get("restored_from") or {}) if after else {}
    ok = (
        step is not None
        and got.get("tier") in ("memory", "peer")
        and got.get("step") == step - obs.facts.get("memory_interval", 1)
    )
    return Check("previous snapshot used", ok, f"killed while copying step {step}; restored from {got or 'nothing'}")


def _attempt_after(obs: Observation, t: float):
    return next((a for a in split_attempts(obs.records) if a.start["time"] > t), None)


def _skipped(restored: dict) -> set[tuple[str, int, int]]:
    return {(d.get("copy"), d.get("rank"), d.get("step")) for d in restored.get("skipped") or []}


def check_damaged_own_copy_replaced_by_replica(obs: Observation) -> Check:
    """The restart after the first damage restored the damaged step itself, that rank's shard from the peer's
    replica, with the damaged own copy named (restored_from's skipped, and its one-line warning)."""
    damage = (obs.facts.get("snapshot_damage") or [{}])[0]
    rank, step = damage.get("rank"), damage.get("step")
    after = _attempt_after(obs, damage.get("time", float("inf")))
    got = (after.start.get("restored_from") or {}) if after else {}
    named = [
        ln
        for ln in obs.log_has("damaged memory snapshot")
        if f"own-node copy of rank {rank}'s shard of step {step} " in ln
    ]
    ok = (
        step is not None
        and got.get("tier") == "peer"
        and got.get("step") == step
        and ("own", rank, step) in _skipped(got)
        and bool(named)
    )
    return Check(
        "damaged own snapshot skipped for the peer replica",
        ok,
        f"rank {rank}'s own copy of step {step} damaged; restored from {_brief(got)}; "
        f"log: {named[0].strip()[:220] if named else 'no line names it'}",
    )


def check_damaged_replica_falls_back_to_storage(obs: Observation) -> Check:
    """The restart after the second damage (own copies and replicas) restored from storage, the damaged
    generations newer than it named as skipped, in one line of the job's log."""
    damages = obs.facts.get("snapshot_damage") or []
    damage = damages[1] if len(damages) > 1 else {}
    rank = damage.get("rank")
    after = _attempt_after(obs, damage.get("time", float("inf")))
    got = (after.start.get("restored_from") or {}) if after else {}
    skipped = _skipped(got)
    newer = {(kind, rank, step) for kind, step in damage.get("damaged", []) if step > got.get("step", 0)}
    said = [ln for ln in obs.log_has("memory snapshots not used") if f"rank {rank}'s" in ln]
    ok = (
        bool(damage)
        and got.get("tier") == "storage"
        and bool(newer)
        and newer <= skipped
        and {"own", "peer"} <= {k for k, _, _ in skipped}
        and bool(said)
    )
    return Check(
        "damaged own snapshot and replica: storage restored, named",
        ok,
        f"damaged: {sorted(damage.get('damaged', []))}; restored from {_brief(got)}; "
        f"log: {said[0].strip()[:220] if said else 'no line names them'}",
    )


def _brief(restored: dict) -> str:
    if not restored:
        return "nothing"
    skipped = sorted(f"{d.get('copy')} r{d.get('rank')} step {d.get('step')}" for d in restored.get("skipped") or [])
    return f"{restored.get('tier')} step {restored.get('step')}" + (f" (skipped {skipped})" if skipped else "")


def check_checkpoint_on_signal(obs: Observation) -> Check:
    t = obs.faults[0].time if obs.faults else float("inf")
    sig = [r for r in obs.records if r.get("event") == "signal" and r["time"] >= t]
    ckpts = {r["step"] for r in obs.records if r.get("event") == "checkpoint"}
    killed = obs.log_has("closing signal SIGKILL")
    step = sig[0]["step"] if sig else None
    ok = bool(sig) and step in ckpts and not killed
    return Check(
        "checkpoint on signal, clean exit",
        ok,
        f"signal logged at step {step}, checkpoint committed: {step in ckpts}, workers SIGKILLed by "
        f"agents: {len(killed)}, first-launch exit codes {obs.facts.get('first_launch_exit_codes')}",
    )


def check_partial_ignored(obs: Observation) -> Check:
    name, interval = obs.facts.get("partial_checkpoint"), obs.facts["interval"]
    after = _restarted_attempts(obs)
    resumed = after[0].resumed_from if after else None
    warned = [line for line in obs.log_has("skipping checkpoint") if name and name in line]
    return Check(
        "partial checkpoint ignored",
        name is not None and resumed == interval and bool(warned),
        f"resumed from step {resumed} (previous complete: {interval}); "
        f"warning: {warned[0].strip()[:160] if warned else 'none'}",
    )


def check_corrupt_skipped(obs: Observation) -> Check:
    name, interval, cut = obs.facts.get("corrupt_checkpoint"), obs.facts["interval"], obs.facts.get("truncated")
    after = _restarted_attempts(obs)
    resumed = after[0].resumed_from if after else None
    warned = [line for line in obs.log_has("WARNING") if name and name in line]
    truncated = bool(cut) and cut["to"] < cut["from"]
    return Check(
        "corrupt checkpoint skipped with a warning",
        truncated and resumed == interval and bool(warned),
        f"{cut['file'] + ' truncated to ' + str(cut['to']) + ' bytes; ' if cut else 'nothing truncated; '}"
        f"resumed from step {resumed}; warning: {warned[0].strip()[:200] if warned else 'none'}",
    )


def check_restarts_used(obs: Observation) -> Check:
    """Every allowed restart was used by a fault before the job gave up (not a crash of its own)."""
    want = obs.facts.get("max_restarts")
    starts = len(_restarted_attempts(obs))
    return Check(
        "every restart used, then the job stopped",
        want is not None and starts == want,
        f"{starts} worker-group restarts after the first fault (--max-restarts {want})",
    )


def check_failure_message(obs: Observation) -> Check:
    lines = obs.log_has("FAILED") + obs.log_has("ChildFailedError")
    return Check("clear failure message", bool(lines), lines[0].strip()[:160] if lines else "none")


def check_checkpoints_intact(obs: Observation) -> Check:
    from training.checkpoint import scan
    from training.compare import load_full

    if obs.checkpoint_dir is None:
        return Check("checkpoints intact", False, "no checkpoint directory")
    good, bad = scan(obs.checkpoint_dir)
    if good:
        try:
            load_full(good[0])
        except Exception as e:  # noqa: BLE001 - reported as the check's detail
            return Check("checkpoints intact", False, f"{good[0].name} does not load: {e}")
    return Check(
        "checkpoints intact",
        bool(good) and not bad,
        f"complete: {[p.name for p in good]}, incomplete/corrupt: {[p.name for p, _ in bad]}",
    )


# ------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class LocalScenario(Scenario):
    """A local scenario (:class:`chaos.scenario.Scenario`: ``inject(run: ScenarioRun)``) and the job it runs in."""

    min_nodes: str = "all"  # "all": fixed-size job (MIN = MAX); "one": elastic down to one node
    flags: tuple[str, ...] = ()  # training flags that do not change the math (fault hooks)
    math: tuple[str, ...] = ()  # training flags that do: the scenario gets its own reference run
    max_restarts: int | None = None  # None: the config's
    spares: int = 0  # hot-spare agents beyond the job's nodes
    nodes: int = 0  # 0: the config's; more gives the scenario its own (reference) job size
    hold: bool = False  # the injector holds the job at a step boundary (ScenarioRun.held) while a node rejoins

    def config(self, cfg: LocalChaosConfig) -> LocalChaosConfig:
        """The job this scenario runs: the config's, or with `nodes` nodes (global batch rounded up to fit)."""
        if self.nodes <= cfg.nodes:
            return cfg
        world = self.nodes * cfg.nproc_per_node
        return replace(cfg, nodes=self.nodes, global_batch=world * -(-cfg.global_batch // world))


def scenarios(cfg: LocalChaosConfig) -> dict[str, LocalScenario]:
    """Every local scenario by name (``chaos.catalog.PLATFORMS["local"]``)."""
    killed = 2 * cfg.interval  # a SIGKILL loses the steps since the last commit; one async save may be in flight
    # The newest in-memory snapshot is restored (re-cut when the world shrank or grew, a lost node's shards
    # from its peer's replica): a failure costs the step in flight.
    same_world = cfg.memory_interval or killed
    storage_only = ("--checkpoint.memory_interval", "0")  # scenarios about the storage tier itself
    table = [
        LocalScenario("worker-kill", inject_worker_kill, Expectation(max_steps_lost=same_world)),
        # failover.in_place: no restart (one attempt); the recovery's own checks bound the steps recomputed
        LocalScenario(
            "worker-kill-in-place",
            inject_worker_kill_in_place,
            Expectation(restart=False),
            (check_survivors_kept_in_place, check_recomputed_in_place),
            flags=("--failover.in_place", "true"),
        ),
        # Dropout masks depend on how a batch is split over ranks: across a world-size change only a
        # dropout-free run can match the reference within fp tolerance.
        LocalScenario(
            "node-loss-rejoin",
            inject_node_loss_rejoin,
            Expectation("close", max_steps_lost=same_world, rejoin_world=cfg.world, atol=cfg.atol),
            (check_shrank_and_grew,),
            min_nodes="one",
            math=("--model.dropout", "0"),
            hold=True,
        ),
        LocalScenario(
            "silent-node",
            inject_silent_node,
            Expectation("close", max_steps_lost=same_world, rejoin_world=cfg.world, atol=cfg.atol),
            (check_silent_node_declared, check_shrank_and_grew),
            min_nodes="one",
            math=("--model.dropout", "0"),
            hold=True,
        ),
        # Fixed size (MIN = MAX) and no replacement started: without the spare the job would wait for one.
        LocalScenario(
            "node-kill-with-spare",
            inject_node_kill_with_spare,
            Expectation(max_steps_lost=same_world),
            (check_spare_took_over,),
            spares=1,
        ),
        # failover.in_place: the spare's workers join the survivors' epoch; nothing restarts (one attempt)
        LocalScenario(
            "node-kill-in-place",
            inject_node_kill_in_place,
            Expectation(restart=False),
            (check_survivors_kept_after_node_loss, check_recomputed_in_place),
            spares=1,
            flags=("--failover.in_place", "true"),
        ),
        # failover.in_place, rank 0's node lost: the spare takes node rank 0 (and the round's store) in place
        LocalScenario(
            "first-node-kill-in-place",
            inject_first_node_kill_in_place,
            Expectation(restart=False),
            (check_survivors_kept_after_node_loss, check_rank0_joined_in_place, check_recomputed_in_place),
            spares=1,
            flags=("--failover.in_place", "true"),
        ),
        # failover.in_place: the spare's workers join once the silent node's lease ends; a survivor blocked on it
        # cuts its group at its agent's request and keeps its process; the group never restarts
        LocalScenario(
            "silent-node-in-place",
            inject_silent_node_in_place,
            Expectation(restart=False),
            (check_silent_node_replaced_in_place, check_blocked_survivors_cut_in_place, check_recomputed_in_place),
            spares=1,
            flags=("--failover.in_place", "true"),
        ),
        # A node silent mid-save: its stopped keep-alives (or the heartbeat watchdog), not the checkpoint group's
        # timeout, declare it.
        LocalScenario(
            "silent-node-during-save",
            inject_silent_node_during_save,
            Expectation(max_steps_lost=same_world),
            (check_silent_node_declared, check_spare_took_over),
            spares=1,
            flags=("--fault.stop_in_save_at_step", str(save_stop_step(cfg)), "--fault.rank", str(cfg.world - 1)),
        ),
        # A slow node, not a dead one: named from the ranks' work times, taken out after a step's snapshot, replaced
        # by the spare: nothing recomputed.
        LocalScenario(
            "straggler",
            inject_straggler,
            Expectation(max_steps_lost=0),
            (check_straggler_named, check_spare_replaced_straggler, check_back_to_speed),
            spares=1,
        ),
        # failover.in_place: only the straggler's workers stop; the spare's join the survivors' epoch in its ranks
        LocalScenario(
            "straggler-in-place",
            inject_straggler_in_place,
            Expectation(restart=False, max_steps_lost=0),
            (
                check_straggler_named,
                check_straggler_left_in_place,
                check_survivors_kept_after_node_loss,
                check_recomputed_in_place,
                check_back_to_speed,
            ),
            spares=1,
            flags=("--failover.in_place", "true"),
        ),
        LocalScenario(
            "first-node-kill",
            inject_first_node_kill,
            Expectation(max_steps_lost=same_world),
            (check_rank0_node_killed,),
        ),
        LocalScenario("preemption", inject_preemption, Expectation(max_steps_lost=0), (check_checkpoint_on_signal,)),
        LocalScenario("hang", inject_hang, Expectation(max_steps_lost=same_world)),
        # The wedge bound's floor lowered to 3 s (from the config's): a tiny step's bound is its floor.
        LocalScenario(
            "wedged-rank",
            inject_wedged_rank,
            Expectation(max_steps_lost=same_world),
            (check_wedge_declared,),
            flags=(
                "--fault.wedge_at_step",
                str(wedge_step(cfg)),
                "--fault.rank",
                str(cfg.world - 1),
                "--parallel.wedge_floor_s",
                "3",
            ),
        ),
        LocalScenario(
            "kill-mid-snapshot",
            inject_kill_mid_snapshot,
            Expectation(max_steps_lost=same_world),
            (check_previous_snapshot_used,),
            flags=(
                "--fault.kill_in_snapshot_at_step",
                str(snapshot_kill_step(cfg)),
                "--fault.rank",
                str(cfg.world - 1),
            ),
        ),
        # Three nodes: the ring's replica of one lost node sat on the other; memory cannot help, storage must.
        LocalScenario(
            "node-pair-loss",
            inject_node_pair_loss,
            Expectation(max_steps_lost=killed),
            (check_fell_back_to_storage,),
            nodes=3,
        ),
        LocalScenario(
            "kill-during-save",
            inject_kill_during_save,
            Expectation(max_steps_lost=killed),
            (check_partial_ignored,),
            flags=("--fault.slow_commit_s", str(cfg.slow_commit_s), *storage_only),
        ),
        LocalScenario(
            "corrupt-checkpoint", inject_corrupt_checkpoint, Expectation(), (check_corrupt_skipped,), flags=storage_only
        ),
        # Two faults: the first costs the step in flight (the replica holds the damaged step; a stop that lands
        # while a snapshot is copied costs one more), the second falls back to the checkpoint of 2 x interval.
        LocalScenario(
            "corrupt-snapshot",
            inject_corrupt_snapshot,
            Expectation(max_steps_lost=killed),
            (check_damaged_own_copy_replaced_by_replica, check_damaged_replica_falls_back_to_storage),
        ),
        # --max-restarts 1 (2 kills): the same path as 3 (4 kills) at half the run time. The kills land as
        # each incarnation starts, before it logs a step, so no restart is expected to train.
        LocalScenario(
            "restarts-exhausted",
            inject_restarts_exhausted,
            Expectation("fail", restart=False),
            (check_restarts_used, check_checkpoints_intact, check_failure_message),
            max_restarts=1,
        ),
        # The membership store's own failures: no restart to measure steps lost by (check_no_new_round: none).
        LocalScenario(
            "store-member-kill",
            inject_store_member_kill,
            Expectation(restart=False, noticed=False),
            (check_leader_replaced, check_no_new_round),
        ),
        LocalScenario(
            "store-outage",
            inject_store_outage,
            Expectation(restart=False, noticed=False),
            (check_trained_through_outage, check_no_new_round),
        ),
        LocalScenario(
            "store-outage-then-worker-kill",
            inject_store_outage_then_worker_kill,
            Expectation(max_steps_lost=same_world),
            (check_reformed_after_store_back,),
        ),
        # Two worker groups of one job (the old one's agents frozen, its workers training on): the old group runs
        # to its next commit, which the fence refuses, so up to two intervals are recomputed by the new group.
        LocalScenario(
            "split-brain",
            inject_split_brain,
            Expectation(noticed=False, max_steps_lost=killed),
            (check_stale_group_fenced,),
            spares=cfg.nodes,
            hold=True,
        ),
    ]
    return scenario_table("local", table)


# ------------------------------------------------------------------------------------------ reference
@dataclass
class Reference:
    """The uninterrupted run: its final checkpoint, records, agent log lines and wall time."""

    final: Path
    records: list[dict]
    logs: list[tuple[float, str]]
    wall_s: float
    cached: bool

    @property
    def effective(self) -> list[dict]:
        return effective_steps(split_attempts(self.records))


def reference(cfg: LocalChaosConfig, cache_root: Path, work: Path, math: tuple[str, ...] = ()) -> Reference:
    """The uninterrupted run every scenario is compared with; computed once per config + training code."""
    key = cfg.reference_key(math)
    cache = cache_root / key
    final = cache / f"step_{cfg.steps:08d}"
    meta = cache / "reference.json"
    from training.checkpoint import verify

    if meta.exists() and verify(final)[0] and (cache / "logs.json").exists():
        print(f"[chaos] reference: cached {cache} (key {key})", flush=True)
        return Reference(
            final,
            load_records(cache / "metrics.jsonl"),
            [tuple(x) for x in json.loads((cache / "logs.json").read_text())],
            json.loads(meta.read_text())["wall_s"],
            True,
        )
    print(
        f"[chaos] reference: computing an uninterrupted {cfg.steps}-step run on {cfg.nodes} node(s) "
        f"{' '.join(math)} (cached under {cache})",
        flush=True,
    )
    run = ScenarioRun(cfg, work / f"reference-{key}", rdzv_id="chaos-ref", min_nodes=cfg.nodes, extra=math)
    try:
        run.cluster.start_all()
        t0 = time.time()
        codes = run.cluster.wait_exit(timeout=cfg.scenario_timeout_s)
        wall = time.time() - t0
    finally:
        run.cluster.close()
    src = run.ckpt / f"step_{cfg.steps:08d}"
    if any(c != 0 for c in codes.values()) or not verify(src)[0]:
        raise ScenarioFailed(f"the reference run failed (exit codes {codes}); see {run.workdir}/logs")
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    shutil.copytree(src, final)
    shutil.copy(run.metrics, cache / "metrics.jsonl")
    logs = [(t, line) for t, _, line in run.cluster.log_lines()]
    (cache / "logs.json").write_text(json.dumps(logs))
    meta.write_text(json.dumps({"key": key, "config": asdict(cfg), "math_args": list(math), "wall_s": wall}, indent=1))
    shutil.rmtree(run.ckpt, ignore_errors=True)  # the cache holds the final step; the rest is not needed
    return Reference(final, run.records(), logs, wall, False)


# ------------------------------------------------------------------------------------------ one scenario
def base_facts(cfg: LocalChaosConfig) -> dict:
    """Facts every local observation carries (the config values scenario checks compare against)."""
    return {"world": cfg.world, "nproc_per_node": cfg.nproc_per_node, "interval": cfg.interval}


def run_scenario(
    cfg: LocalChaosConfig, sc: LocalScenario, ref: Reference, root: Path, keep: bool = False
) -> ScenarioResult:
    """Inject ``sc`` into a fresh job, observe it to the end, judge it against ``ref`` (of ``sc.config(cfg)``)."""
    cfg = sc.config(cfg)
    run = ScenarioRun(
        cfg,
        root / sc.name,
        rdzv_id=f"chaos-{sc.name}",
        min_nodes=cfg.nodes if sc.min_nodes == "all" else 1,
        extra=sc.math + sc.flags,
        max_restarts=sc.max_restarts,
        spares=sc.spares,
        hold=sc.hold,
    )
    res = ScenarioResult(name=sc.name, title=sc.title, outcome=sc.expect.outcome, workdir=str(run.workdir))
    print(f"[chaos] {sc.name}: {sc.title}", flush=True)
    res.t0 = time.time()
    try:
        sc.inject(run)
        run.cluster.wait_exit(timeout=max(5.0, run.deadline - time.monotonic()))
    except (ScenarioFailed, ClusterError) as e:
        res.error = str(e)
    except Exception as e:  # noqa: BLE001 - a harness bug must not stop the other scenarios
        res.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        codes = run.cluster.exit_codes()
        run.facts["store_alive_at_end"] = run.cluster.store_alive()
        run.cluster.close()
    nodes = run.cluster.nodes
    res.wall_s = (
        (max(n.ended or time.time() for n in nodes) - min(n.started for n in nodes)) if nodes else time.time() - res.t0
    )
    res.events = run.cluster.events
    obs = observe(cfg, run, codes, ref, sc.expect.atol if sc.expect.outcome == "close" else 0.0, res)
    res.apply(judge(obs, sc.expect, sc.checks))
    res.figures["exit codes"] = codes
    res.timeline = [r for r in obs.records if r.get("event") in TIMELINE_EVENTS]
    if res.passed and not keep:
        _drop_bulk(run)
    return res


def _drop_bulk(run: ScenarioRun) -> None:
    """Remove what a passing scenario leaves that only a failing one needs, keeping its logs and metrics: the
    checkpoints (~100 MB each), the nodes' in-memory snapshots and the etcd members' data (each member
    preallocates a 64 MB log segment); a full ``make chaos-test`` left ~5 GB without this."""
    bulk = [run.ckpt, run.workdir / "node-memory", *(run.workdir / "etcd").glob("m[0-9]*")]
    for path in bulk:
        shutil.rmtree(path, ignore_errors=True)


def observe(
    cfg: LocalChaosConfig,
    run: ScenarioRun,
    codes: dict[str, int | None],
    ref: Reference,
    atol: float,
    res: ScenarioResult,
) -> Observation:
    """The observation of a finished scenario run (the verdict's only input)."""
    from training.goodput.analysis import torchrun_detections

    logs = [(t, line) for t, _, line in run.cluster.log_lines()]
    faults = [
        Fault(e["label"], e["time"], e["confirmed"], e["evidence"]) for e in run.cluster.events if e["kind"] == "fault"
    ]
    hit = {name for e in run.cluster.events for name in e.get("agents_hit", [])}
    clean = {k: v for k, v in codes.items() if k not in hit}
    if res.outcome == "fail":
        exited_ok = False if codes and all(v not in (0, None) for v in codes.values()) else None
    else:
        exited_ok = bool(clean) and all(v == 0 for v in clean.values())
    final = run.ckpt / f"step_{cfg.steps:08d}"
    return Observation(
        records=run.records(),
        faults=faults,
        detections=torchrun_detections(logs),
        rejoins=[e["time"] for e in run.cluster.events if e["kind"] == "rejoin"],
        exited_ok=exited_ok,
        exit_detail=f"exit codes {codes} (hit by the fault: {sorted(hit) or 'none'})",
        steps=cfg.steps,
        global_batch=cfg.global_batch,
        final_committed=(final / MARKER).exists(),
        weight_diffs=compare_weights(final, ref.final, atol),
        reference_records=ref.records,
        wall_s=res.wall_s,
        error=res.error,
        logs=logs,
        checkpoint_dir=run.ckpt,
        facts={**base_facts(cfg), **run.facts},
    )

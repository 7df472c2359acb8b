"""Goodput soak: the debug job for a given wall time with one random fault per minute, against an
uninterrupted run of the same length.

``python -m chaos.local --soak 10m`` (``make chaos-test SOAK=10m``):

1. Sizes the job: as many steps as the uninterrupted job does in the soak's duration (the seconds per step
   come from the standard chaos reference run, cached).
2. Runs that job uninterrupted (the reference, cached by config + training code) and measures its goodput.
3. Runs the same job on the simulated nodes plus ``spares`` hot spares, and every ``every_s`` seconds injects
   one fault drawn from :data:`SOAK_FAULTS` with a seeded generator (the schedule is printed as it is drawn):
   a worker SIGKILL, a node SIGKILL, a silent node (SIGSTOP of its agent and workers), a hung worker
   (SIGSTOP) or a straggler (a node stopped 0.2 s of every 0.3 s until the job takes it out). A lost or slow
   node's place is taken by the spare; the machine is then fenced and comes back as the new spare, so every node
   fault finds one (the job takes a straggler out at most once per half fault period here:
   ``--straggler.evict_window_s``).
4. Judges the run like any scenario (:func:`chaos.verdict.judge`: each fault confirmed, noticed and recovered
   from, at most ``memory_interval`` steps recomputed per fault, every sample exactly once, final weights
   bitwise equal to the reference's) and reports goodput = useful step time / wall time, for both runs, with
   each fault's detect and recover seconds (table, ``report.json``, ``timeline.png``).

Goodput is a figure, not a pass condition: the target (>= 90% of the reference's) is reported as met or not.
Training flags after ``--`` go to the soaked job: with ``--failover.in_place true`` the faults it recovers from in
place (a killed or hung worker, a lost or silent node with the spare) count as recovered at the first step after
the job's ``in_place`` record (:func:`training.goodput.analysis.recovered_in_place`), with no new attempt.
"""

from __future__ import annotations

import random
import re
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

from training.goodput.analysis import DETECT_RE
from chaos.local.cluster import ClusterError
from chaos.local.config import LocalChaosConfig
from chaos.local.scenarios import ScenarioFailed, ScenarioRun, observe, reference, training_and_spares
from chaos.report import TIMELINE_EVENTS, ScenarioResult
from chaos.verdict import Expectation, judge

SOAK_FAULTS = ("worker-kill", "node-kill", "silent-node", "hang", "straggler")
NODE_FAULTS = ("node-kill", "silent-node", "straggler")  # each takes a node out: the spare must be there
GOODPUT_TARGET = 0.90  # of the uninterrupted run's goodput
#: The records that say the job recovered from a fault: a new attempt's start, or (``failover.in_place``) the
#: survivors' recovery in their processes.
RECOVERED = ("start", "in_place")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


class SoakConfigError(ValueError):
    """A soak setting that cannot work (the message names the value and the fix)."""


def parse_duration(text: str) -> float:
    """``90s``, ``10m``, ``1h`` or plain seconds -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise SoakConfigError(f"SOAK={text!r} is not a duration: use e.g. 90s, 10m or 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


@dataclass(frozen=True)
class SoakConfig:
    """One soak.

    Attributes:
        duration_s: wall time of the uninterrupted job (the soaked job runs the same steps, so longer).
        every_s: one fault per this many seconds.
        seed: seeds the choice of fault, target and moment within each period.
        spares: hot-spare agents beyond the job's nodes (node faults need one to keep the world size).
        faults: the kinds drawn from.
    """

    duration_s: float
    every_s: float = 60.0
    seed: int = 0
    spares: int = 1
    faults: tuple[str, ...] = SOAK_FAULTS

    def validate(self) -> None:
        if self.every_s < 20:
            raise SoakConfigError(
                f"--soak-every {self.every_s:g} s: use >= 20 s, so each fault is recovered from before the next"
            )
        if self.duration_s < 2 * self.every_s:
            raise SoakConfigError(
                f"SOAK={self.duration_s:g} s is shorter than two fault periods "
                f"({2 * self.every_s:g} s): use e.g. SOAK=10m"
            )
        bad = [f for f in self.faults if f not in SOAK_FAULTS]
        if bad:
            raise SoakConfigError(f"soak fault(s) {bad}: choose from {', '.join(SOAK_FAULTS)}")
        if self.spares < 1 and set(NODE_FAULTS) & set(self.faults):
            raise SoakConfigError(
                f"--soak-spares {self.spares}: node faults in a fixed-size soak need a hot spare: "
                f"use --soak-spares 1 (make chaos-test: SPARES=1, or unset SPARES)"
            )


@dataclass(frozen=True)
class Planned:
    """One drawn fault: when (seconds after the job's first step) and what."""

    at_s: float
    kind: str


def schedule(cfg: SoakConfig, periods: int) -> list[Planned]:
    """The first ``periods`` faults of the seeded schedule: one per period, at a random moment in its middle
    half (never in the first seconds of a period, so the previous fault had ``every_s / 4`` to recover)."""
    rng = random.Random(cfg.seed)
    return [
        Planned(round(i * cfg.every_s + rng.uniform(0.25, 0.75) * cfg.every_s, 1), rng.choice(cfg.faults))
        for i in range(periods)
    ]


def soak_steps(step_s: float, duration_s: float, interval: int) -> int:
    """Steps the uninterrupted job runs in ``duration_s`` (at least three checkpoint intervals)."""
    return max(3 * interval, int(duration_s / step_s))


def seconds_per_step(records: list[dict]) -> float:
    """Wall seconds per step of an uninterrupted run after its first step (checkpoint stalls included)."""
    times = [r["time"] for r in records if r.get("event") == "step" and r.get("step", 0) >= 1]
    if len(times) < 3:
        raise ScenarioFailed("the reference run logged too few steps to size the soak with")
    return (times[-1] - times[0]) / (len(times) - 1)


# ------------------------------------------------------------------------------------------ injection
class SoakInjector:
    """Injects the scheduled faults into a running :class:`ScenarioRun` until the job ends."""

    def __init__(self, run: ScenarioRun, cfg: SoakConfig):
        self.run, self.cfg, self.cluster = run, cfg, run.cluster
        self.rng = random.Random(cfg.seed + 1)  # targets: independent of the schedule's draws
        self.injected: list[dict] = []
        self.slowed: list = []  # the duty cycles of straggler faults (each ends with its node's agent)

    def _ready(self, kind: str) -> bool:
        """Full world training, and a spare waiting for a node fault."""
        training, spares = training_and_spares(self.run)
        return len(training) >= self.run.cfg.nodes and (kind not in NODE_FAULTS or bool(spares))

    def _next_index(self) -> int:
        return max(n.index for n in self.cluster.nodes) + 1

    def run_until_done(self) -> None:
        run = self.run
        run.cluster.start_all()
        first = run.wait_step(1)
        t0 = first["time"]
        run.facts["soak_t0"] = t0
        i = 0
        while self.cluster.alive() and time.monotonic() < run.deadline:
            plan = schedule(self.cfg, i + 1)[i]
            print(f"[soak] fault {i + 1}: {plan.kind} at +{plan.at_s:.0f} s", flush=True)
            while time.time() < t0 + plan.at_s:
                if not self.cluster.alive():
                    return
                time.sleep(0.2)
            waited = time.time()
            while not self._ready(plan.kind):  # the previous fault is still being recovered from
                if not self.cluster.alive():
                    return
                if time.time() - waited > self.cfg.every_s / 2:
                    training, spares = training_and_spares(self.run)
                    raise ScenarioFailed(
                        f"fault {i + 1} ({plan.kind}): the job was not back at full size with a "
                        f"spare {self.cfg.every_s / 2:.0f} s after its moment (training nodes "
                        f"{training}, spares {spares})"
                    )
                time.sleep(0.2)
            for _ in range(3):  # a restart may move ranks between the moment we look and the signal
                try:
                    self.inject(plan.kind)
                    break
                except ClusterError as e:
                    if not self.cluster.alive():
                        return
                    print(f"[soak] fault {i + 1}: {e}; trying again", flush=True)
                    time.sleep(1.0)
            i += 1

    def inject(self, kind: str) -> None:
        c, (training, _) = self.cluster, training_and_spares(self.run)
        victim = self.rng.choice(training)
        self.injected.append({"kind": kind, "node": victim, "time": time.time()})
        if kind == "worker-kill":
            c.signal_worker(victim, signal.SIGKILL)
        elif kind == "hang":
            c.signal_worker(victim, signal.SIGSTOP)
        elif kind == "node-kill":
            c.kill_node(victim)
            self._replace_later(victim, fence=False)
        elif kind == "silent-node":
            c.stop_node(victim)
            self._replace_later(victim, fence=True)
        elif kind == "straggler":
            self.slowed.append(c.slow_node(victim))
            self._replace_later(victim, fence=False)  # the job takes it out; its agent leaves

    def _replace_later(self, victim: int, *, fence: bool) -> None:
        """Bring the lost machine back as the next spare (a new node index) once the job trains again at full
        size on the current spare. A silent node is fenced (SIGKILLed, memory wiped) as soon as the job noticed
        it (a watchdog or agent line), as a cluster's health system would: until then its processes live on, and
        if it ran rank 0 its worker still holds the checkpoint directory's lock, which the next incarnation
        waits for (docs/failover.md, known limits)."""
        t = self.cluster.events[-1]["time"]
        if fence:
            self.run.wait_for(
                lambda: any(tl > t and _noticed(line) for tl, _, line in self.cluster.log_lines()),
                "the job to notice the silent node",
            )
            self.cluster.kill_node(victim, record=False)
        start = self.run.wait_for(  # the old attempt may log a step after the fault
            lambda: next((r for r in self.run.records() if r.get("event") in RECOVERED and r["time"] > t), None),
            "the job to recover (a new attempt, or its workers in place)",
        )
        self.run.wait_step(1, world=self.run.cfg.world, after=start["time"])
        self.cluster.start_node(self._next_index(), kind="spare")


def _noticed(line: str) -> bool:
    """A log line saying the job noticed a failure: a peer's watchdog, an agent's heartbeat kill (a peer whose
    rank 0, the store's host, went silent blocks on the store and is killed by its own agent), or torchrun."""
    return "[watchdog]" in line or "has sent no heartbeat" in line or bool(DETECT_RE.search(line))


def soak_restarts(soak: SoakConfig) -> int:
    """torchrun's --max-restarts for the soak: every fault restarts the worker groups, so it must outlast the soak
    (a long job sets it high too; a node joining does not count)."""
    return 3 * int(4 * soak.duration_s / soak.every_s) + 3


def soak_flags(soak: SoakConfig) -> tuple[str, ...]:
    """Training flags of the soaked job (none changes the math): a straggler may be taken out once per half
    fault period, so each straggler fault is recovered from before the next (the default window is 10 min)."""
    return ("--straggler.evict_window_s", f"{soak.every_s / 2:g}")


def soak_plan(cfg: LocalChaosConfig, soak: SoakConfig) -> str:
    """What ``--soak`` would run (DRY_RUN=1): its settings, the seeded fault schedule and one agent's command."""
    from training.launch import RDZV_ENV, LaunchConfig, format_argv, torchrun_argv

    periods = max(1, int(soak.duration_s // soak.every_s))
    lines = [
        f"soak: {soak.duration_s:g} s on {cfg.nodes} simulated node(s) x {cfg.nproc_per_node} proc + "
        f"{soak.spares} hot spare(s), preset {cfg.preset}; one fault of {', '.join(soak.faults)} every "
        f"{soak.every_s:g} s, seed {soak.seed}",
        f"steps: as many as the uninterrupted job runs in {soak.duration_s:g} s, sized from the chaos reference "
        f"run (computed once, cached under --cache), then that job uninterrupted (the goodput reference), then "
        f"the soak itself",
        f"fault schedule (seconds after the soak's first step; it goes on while the job runs), first {periods}:",
    ]
    lines += [f"  {i + 1:>3} {f'+{p.at_s:.1f}':>8} s  {p.kind}" for i, p in enumerate(schedule(soak, periods))]
    launch = LaunchConfig(
        min_nodes=cfg.nodes,
        max_nodes=cfg.nodes,
        spares=soak.spares,
        coordinator=cfg.coordinator,
        nproc_per_node=cfg.nproc_per_node,
        rdzv_id="chaos-soak",
        rdzv_endpoint="127.0.0.1:29400",
        max_restarts=soak_restarts(soak),
        train_timeout_s=cfg.train_timeout_s,
        train_args=tuple(cfg.training_args("<run>/soak/job", *soak_flags(soak))),
    )
    lines += [
        "agent command (per node and spare; the store's port is picked at start; --train.steps from the sizing):",
        format_argv(torchrun_argv(launch), RDZV_ENV),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ the soak
def run_soak(cfg: LocalChaosConfig, soak: SoakConfig, cache: Path, out: Path) -> tuple[ScenarioResult, object]:
    """Size, reference, soak, judge: returns the soak's result and its reference (:class:`Reference`)."""
    base = reference(cfg, cache, out)
    step_s = seconds_per_step(base.records)
    steps = soak_steps(step_s, soak.duration_s, cfg.interval)
    job = replace(cfg, steps=steps, scenario_timeout_s=max(cfg.scenario_timeout_s, 4 * soak.duration_s + 300))
    print(
        f"[soak] {steps} steps (~{step_s:.2f} s each uninterrupted: {soak.duration_s:.0f} s), one fault of "
        f"{', '.join(soak.faults)} every {soak.every_s:.0f} s, seed {soak.seed}, {soak.spares} hot spare(s)",
        flush=True,
    )
    ref = reference(job, cache, out)
    print(f"[soak] reference: {steps} steps uninterrupted in {ref.wall_s:.0f} s", flush=True)
    run = ScenarioRun(
        job,
        out / "soak",
        rdzv_id="chaos-soak",
        min_nodes=job.nodes,
        spares=soak.spares,
        max_restarts=soak_restarts(soak),
        extra=soak_flags(soak),
    )
    res = ScenarioResult(
        name="soak",
        title=f"{soak.duration_s / 60:g} min soak: one fault per "
        f"{soak.every_s:.0f} s ({', '.join(soak.faults)}), seed {soak.seed}",
        workdir=str(run.workdir),
    )
    res.t0 = time.time()
    injector = SoakInjector(run, soak)
    try:
        injector.run_until_done()
        run.cluster.wait_exit(timeout=max(5.0, run.deadline - time.monotonic()))
    except (ScenarioFailed, ClusterError) as e:
        res.error = str(e)
    finally:
        for slow in injector.slowed:
            slow.stop()
        codes = run.cluster.exit_codes()
        run.cluster.close()
    nodes = run.cluster.nodes
    res.wall_s = max(n.ended or time.time() for n in nodes) - min(n.started for n in nodes)
    res.events = run.cluster.events
    obs = observe(job, run, codes, ref, 0.0, res)
    res.apply(judge(obs, Expectation(max_steps_lost=job.memory_interval or job.interval)))
    res.figures.update(
        {"exit codes": codes, "faults": injector.injected, "steps": steps, "reference_wall_s": ref.wall_s}
    )
    res.timeline = [r for r in obs.records if r.get("event") in TIMELINE_EVENTS]
    return res, ref


def fault_table(res: ScenarioResult) -> str:
    """One line per fault: when, what, where, detect and recover seconds, steps recomputed, state tier."""
    head = f"{'#':>3} {'at s':>7}  {'fault':<16}{'detect s':>9}{'recover s':>10}{'lost':>6}  tier"
    lines = [head, "-" * len(head)]
    t0 = res.t0
    for i, r in enumerate(x for x in res.recoveries if x.kind != "rejoin"):
        f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(
            f"{i + 1:>3} {r.time - t0:>7.0f}  {r.kind:<16}{f(r.detect_s):>9}{f(r.recover_s):>10}"
            f"{'-' if r.steps_lost is None else r.steps_lost:>6}  {r.tier or '-'}"
        )
    return "\n".join(lines)

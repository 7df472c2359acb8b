"""The failure scenarios, the cached reference run, and the verdicts.

Each scenario starts a fresh simulated cluster on a fresh checkpoint directory, injects its failure once the
job has logged ``cfg.kill_step`` (mid checkpoint interval), lets the job finish, and is judged from the
metrics JSONL, the timestamped agent logs and the final checkpoint against the uninterrupted reference.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from chaos.analysis import (ChainError, Recovery, effective_steps, exactly_once, goodput,
                                     load_records, max_loss_diff, recovery, split_attempts)
from chaos.local.cluster import ClusterError, LocalCluster
from chaos.local.config import ChaosConfig
from training.launch import LaunchConfig

MARKER = "COMMITTED.json"  # the training core's commit marker (written last, by rank 0)


class ScenarioFailed(RuntimeError):
    """The scenario could not proceed (the job died early, or a wait timed out)."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class ScenarioResult:
    key: str
    name: str
    title: str
    passed: bool = False
    expect: str = "bitwise"
    checks: list[Check] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    world_sizes: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    useful_s: float = 0.0
    goodput: float = 0.0
    error: str | None = None
    workdir: str = ""
    t0: float = 0.0
    events: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("timeline")
        return d


@dataclass
class Expect:
    """What a scenario promises: its outcome and extra checks run after the job ended."""

    outcome: str = "bitwise"  # bitwise | close | fail
    rejoin_world: int | None = None  # the job must grow back to this world size (scenario b)
    checks: list[Callable[[], Check]] = field(default_factory=list)


class Run:
    """One scenario's cluster, paths and waits."""

    def __init__(self, cfg: ChaosConfig, workdir: Path, *, key: str, min_nodes: int, extra: tuple[str, ...] = (),
                 max_restarts: int | None = None):
        self.cfg = cfg
        self.workdir = workdir
        if workdir.exists():
            shutil.rmtree(workdir)
        self.out = workdir / "job"
        self.ckpt = self.out / "checkpoints"
        self.metrics = self.out / "metrics.jsonl"
        launch = LaunchConfig(min_nodes=min_nodes, max_nodes=cfg.nodes, nproc_per_node=cfg.nproc_per_node,
                              rdzv_id=f"chaos-{key}", external_store=True,
                              max_restarts=cfg.max_restarts if max_restarts is None else max_restarts,
                              train_timeout_s=cfg.train_timeout_s,
                              train_args=tuple(cfg.training_args(self.out, *extra)))
        self.cluster = LocalCluster(workdir, launch)
        self.result: ScenarioResult | None = None  # set by run_scenario; late checks read its figures
        self.store_alive_at_end = False
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

    def wait_start_after(self, t: float) -> dict:
        return self.wait_for(lambda: next((r for r in self.records()
                                           if r.get("event") == "start" and r["time"] > t), None),
                             "the restarted workers to start")

    def log_has(self, needle: str) -> list[str]:
        return [line for _, _, line in self.cluster.log_lines() if needle in line]


# ------------------------------------------------------------------------------------------ scenarios
def _victim(run: Run) -> int:
    """A node that does not host rank 0 (so 'first node' and 'other node' failures differ)."""
    first = run.cluster.node_of_rank(0)
    return next(i for i in reversed(range(run.cfg.nodes)) if i != first)


def scenario_a(run: Run) -> Expect:
    run.cluster.start_all()
    run.wait_step(run.cfg.kill_step)
    run.cluster.signal_worker(_victim(run), signal.SIGKILL)
    return Expect("bitwise")


def scenario_b(run: Run) -> Expect:
    cfg = run.cfg
    run.cluster.start_all()
    run.wait_step(cfg.kill_step)
    victim = _victim(run)
    run.cluster.kill_node(victim)
    t_kill = run.cluster.events[-1]["time"]
    small = (cfg.nodes - 1) * cfg.nproc_per_node
    first_small = run.wait_step(1, world=small, after=t_kill)
    run.wait_step(first_small["step"] + 1, world=small, after=t_kill)  # trains on at the smaller size
    run.cluster.start_node(victim, kind="rejoin")
    return Expect("close", rejoin_world=cfg.world, checks=[lambda: Check(
        "shrank and grew back", small in _worlds(run) and _worlds(run)[-1] == cfg.world,
        f"world sizes {_worlds(run)}")])


def scenario_c(run: Run) -> Expect:
    run.cluster.start_all()
    run.wait_step(run.cfg.kill_step)
    first = run.cluster.node_of_rank(0)
    if first is None:
        raise ScenarioFailed("could not find the node running rank 0")
    run.cluster.kill_node(first)
    # A fixed-size job (MIN = MAX) waits for a replacement, as Slurm requeue / a Kubernetes pod restart
    # would provide; the store is not on any node, so the survivors never lose the rendezvous.
    run.cluster.start_node(first, kind="replace")
    return Expect("bitwise", checks=[lambda: Check(
        "store survived", run.store_alive_at_end, "the standalone rendezvous store ran until the job ended"
        if run.store_alive_at_end else "the rendezvous store died")])


def scenario_d(run: Run) -> Expect:
    cfg = run.cfg
    run.cluster.start_all()
    run.wait_step(cfg.kill_step)
    run.cluster.signal_everything(signal.SIGTERM)
    t_sig = run.cluster.events[-1]["time"]
    first_gen = list(run.cluster.nodes)
    codes = run.cluster.wait_exit(timeout=run.cluster.launch.shutdown_timeout_s + 60)
    if any(c is None for c in codes.values()):
        raise ScenarioFailed(f"agents still running {run.cluster.launch.shutdown_timeout_s + 60} s after SIGTERM")
    killed = [line for _, _, line in run.cluster.log_lines() if "closing signal SIGKILL" in line]
    sig = [r for r in run.records() if r.get("event") == "signal" and r["time"] >= t_sig]
    ckpts = {r["step"] for r in run.records() if r.get("event") == "checkpoint"}
    run.cluster.event("exited", None, f"exit codes {codes}; relaunching")
    run.cluster.relaunch(f"chaos-d-r1")

    def clean() -> Check:
        step = sig[0]["step"] if sig else None
        ok = bool(sig) and step in ckpts and not killed
        return Check("checkpoint on signal, clean exit", ok,
                     f"signal logged at step {step}, checkpoint committed: {step in ckpts}, "
                     f"workers SIGKILLed by agents: {len(killed)}, first-launch exit codes "
                     f"{[n.proc.returncode for n in first_gen]}")
    return Expect("bitwise", checks=[clean, lambda: _zero_lost(run)])


def _zero_lost(run: Run) -> Check:
    lost = [r.steps_lost for r in run.result.recoveries]
    return Check("no steps lost", bool(lost) and all(x == 0 for x in lost), f"steps lost {lost}")


def scenario_e(run: Run) -> Expect:
    run.cluster.start_all()
    run.wait_step(run.cfg.kill_step)
    run.cluster.signal_worker(_victim(run), signal.SIGSTOP)

    def detected() -> Check:
        d = run.result.recoveries[0].detect_s if run.result.recoveries else None
        return Check("hang detected", d is not None,
                     f"detected after {d:.1f} s (target <= 30 s; process-group timeout "
                     f"{run.cfg.train_timeout_s} s)" if d is not None else "no failure was logged")
    return Expect("bitwise", checks=[detected])


def scenario_f(run: Run) -> Expect:
    cfg = run.cfg
    run.cluster.start_all()
    target = 2 * cfg.interval  # first checkpoint after the kill step
    d = run.ckpt / f"step_{target:08d}"

    def in_flight():  # data (and DCP's .metadata) written, commit marker not yet
        return d.is_dir() and (d / ".metadata").exists() and not (d / MARKER).exists()
    run.wait_for(in_flight, f"the async checkpoint of step {target} to be written but not committed", poll=0.05)
    node0 = run.cluster.node_of_rank(0)
    run.cluster.signal_worker(node0, signal.SIGKILL, rank=0)
    partial = [p.name for p in d.iterdir()] if d.is_dir() else []
    run.cluster.event("observed", None, f"{d.name} held {sorted(partial)} without {MARKER} at the kill")

    def ignored() -> Check:
        starts = [a for a in split_attempts(run.records())[1:]]
        resumed = starts[0].resumed_from if starts else None
        warned = [line for line in run.log_has(f"skipping checkpoint") if d.name in line]
        return Check("partial checkpoint ignored", resumed == cfg.interval and bool(warned),
                     f"resumed from step {resumed} (previous complete: {cfg.interval}); "
                     f"warning: {warned[0].strip()[:160] if warned else 'none'}")
    return Expect("bitwise", checks=[ignored])


def scenario_g(run: Run) -> Expect:
    cfg = run.cfg
    run.cluster.start_all()
    target = 2 * cfg.interval
    run.wait_for(lambda: any(r.get("event") == "checkpoint" and r["step"] == target for r in run.records()),
                 f"the checkpoint of step {target} to be committed", poll=0.05)
    d = run.ckpt / f"step_{target:08d}"
    shard = max((p for p in d.glob("*.distcp")), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    run.cluster.event("corrupt", None, f"truncated {d.name}/{shard.name} from {size} to {size // 2} bytes")
    run.cluster.signal_worker(_victim(run), signal.SIGKILL)

    def fell_back() -> Check:
        starts = split_attempts(run.records())[1:]
        resumed = starts[0].resumed_from if starts else None
        warned = [line for line in run.log_has("WARNING") if d.name in line]
        return Check("corrupt checkpoint skipped with a warning", resumed == cfg.interval and bool(warned),
                     f"resumed from step {resumed}; warning: {warned[0].strip()[:200] if warned else 'none'}")
    return Expect("bitwise", checks=[fell_back])


def scenario_h(run: Run) -> Expect:
    cfg = run.cfg
    run.cluster.start_all()
    run.wait_step(cfg.kill_step)
    victim = _victim(run)
    killed: list[int] = []
    t_last = 0.0
    for i in range(run.cluster.launch.max_restarts + 1):
        if i:  # kill each new incarnation once it is up (process group formed, checkpoint loaded)
            run.wait_start_after(t_last)
        pid = run.wait_for(lambda: next((p for p in run.cluster.workers(victim) if p not in killed), None),
                           "a new worker on the victim node")
        run.cluster.signal_worker(victim, signal.SIGKILL)
        killed.append(pid)
        t_last = run.cluster.events[-1]["time"]

    def intact() -> Check:
        from training.checkpoint import scan
        from training.compare import load_full
        good, bad = scan(run.ckpt)
        loads = False
        if good:
            try:
                loads = bool(load_full(good[0]))
            except Exception as e:  # noqa: BLE001 - reported as the check's detail
                return Check("checkpoints intact", False, f"{good[0].name} does not load: {e}")
        return Check("checkpoints intact", bool(good) and not bad and loads,
                     f"complete: {[p.name for p in good]}, incomplete/corrupt: {[p.name for p, _ in bad]}")

    def message() -> Check:
        lines = run.log_has("FAILED") + run.log_has("ChildFailedError")
        return Check("clear failure message", bool(lines), lines[0].strip()[:160] if lines else "none")
    return Expect("fail", checks=[intact, message])


def _worlds(run: Run) -> list[int]:
    out: list[int] = []
    for r in run.steps():
        if not out or out[-1] != r["world_size"]:
            out.append(r["world_size"])
    return out


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str
    title: str
    fn: Callable[[Run], Expect]
    min_nodes: str = "all"  # "all": fixed-size job (MIN = MAX); "one": elastic down to one node
    extra: tuple[str, ...] = ()  # training flags that do not change the math (fault hooks)
    math: tuple[str, ...] = ()  # training flags that do: the scenario gets its own reference run
    max_restarts: int | None = None  # None: the config's


def scenarios(cfg: ChaosConfig) -> dict[str, Scenario]:
    return {s.key: s for s in [
        Scenario("a", "worker-kill", "SIGKILL one worker process mid-training", scenario_a),
        # Dropout masks depend on how a batch is split over ranks: across a world-size change only a
        # dropout-free run can match the reference within fp tolerance.
        Scenario("b", "node-loss-rejoin", "SIGKILL a whole node, continue smaller, node rejoins", scenario_b,
                 min_nodes="one", math=("--model.dropout", "0")),
        Scenario("c", "first-node-kill", "SIGKILL the node running rank 0; a replacement joins", scenario_c),
        Scenario("d", "preemption", "SIGTERM every process, checkpoint on signal, relaunch", scenario_d),
        Scenario("e", "hung-worker", "SIGSTOP one worker: timeout detects the hang, restart", scenario_e),
        Scenario("f", "kill-during-save", "SIGKILL rank 0 while an async checkpoint is uncommitted", scenario_f,
                 extra=("--fault.slow_commit_s", str(cfg.slow_commit_s))),
        Scenario("g", "corrupt-checkpoint", "truncate a shard of the newest checkpoint, then kill", scenario_g),
        # h uses --max-restarts 1 (2 kills): the same path as 3 (4 kills) at half the run time.
        Scenario("h", "restarts-exhausted", "2 worker kills > --max-restarts 1: job fails cleanly, ckpts intact",
                 scenario_h, max_restarts=1),
    ]}


# ------------------------------------------------------------------------------------------ reference
@dataclass
class Reference:
    final: Path
    records: list[dict]
    effective: list[dict]
    wall_s: float
    cached: bool


def reference(cfg: ChaosConfig, cache_root: Path, work: Path, math: tuple[str, ...] = ()) -> Reference:
    """The uninterrupted run every scenario is compared with; computed once per config + training code."""
    key = cfg.reference_key(math)
    cache = cache_root / key
    final = cache / f"step_{cfg.steps:08d}"
    meta = cache / "reference.json"
    from training.checkpoint import verify
    if meta.exists() and verify(final)[0]:
        records = load_records(cache / "metrics.jsonl")
        print(f"[chaos] reference: cached {cache} (key {key})", flush=True)
        return Reference(final, records, effective_steps(split_attempts(records)),
                         json.loads(meta.read_text())["wall_s"], True)
    print(f"[chaos] reference: computing an uninterrupted {cfg.steps}-step run on {cfg.nodes} node(s) "
          f"{' '.join(math)} (cached under {cache})", flush=True)
    run = Run(cfg, work / f"reference-{key}", key="ref", min_nodes=cfg.nodes, extra=math)
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
    meta.write_text(json.dumps({"key": key, "config": asdict(cfg), "math_args": list(math), "wall_s": wall},
                               indent=1))
    shutil.rmtree(run.ckpt, ignore_errors=True)  # the cache holds the final step; the rest is not needed
    records = run.records()
    return Reference(final, records, effective_steps(split_attempts(records)), wall, False)


# ------------------------------------------------------------------------------------------ evaluation
def run_scenario(cfg: ChaosConfig, sc: Scenario, ref: Reference, root: Path, keep: bool = False) -> ScenarioResult:
    res = ScenarioResult(key=sc.key, name=sc.name, title=sc.title)
    run = Run(cfg, root / f"{sc.key}-{sc.name}", key=sc.key,
              min_nodes=cfg.nodes if sc.min_nodes == "all" else 1, extra=sc.math + sc.extra,
              max_restarts=sc.max_restarts)
    run.result = res
    res.workdir = str(run.workdir)
    print(f"[chaos] {sc.key}. {sc.name}: {sc.title}", flush=True)
    t0 = time.time()
    res.t0 = t0
    expect = Expect()
    try:
        expect = sc.fn(run)
        res.expect = expect.outcome
        left = max(5.0, run.deadline - time.monotonic())
        run.cluster.wait_exit(timeout=left)
    except (ScenarioFailed, ClusterError) as e:
        res.error = str(e)
    except Exception as e:  # noqa: BLE001 - a harness bug must not stop the other scenarios
        res.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        codes = run.cluster.exit_codes()
        run.store_alive_at_end = run.cluster.store is not None and run.cluster.store.poll() is None
        run.cluster.close()
    res.wall_s = max((n.ended or time.time()) for n in run.cluster.nodes) - min(n.started for n in run.cluster.nodes) \
        if run.cluster.nodes else time.time() - t0
    res.exit_codes = codes
    res.events = run.cluster.events
    _judge(cfg, run, res, expect, ref)
    if res.passed and not keep and run.ckpt.exists():
        shutil.rmtree(run.ckpt)  # keep logs and metrics; checkpoints are ~100 MB each
    return res


def _judge(cfg: ChaosConfig, run: Run, res: ScenarioResult, expect: Expect, ref: Reference) -> None:
    records = run.records()
    attempts = split_attempts(records)
    logs = run.cluster.log_lines()
    res.timeline = [r for r in records if r.get("event") in ("step", "start", "signal", "checkpoint", "end")]
    res.world_sizes = _worlds(run)
    disruptions = [e for e in res.events if e["kind"] in ("fault", "rejoin")]
    for i, ev in enumerate(disruptions):
        until = disruptions[i + 1]["time"] if i + 1 < len(disruptions) else None
        if ev["kind"] == "rejoin":
            res.recoveries.append(recovery("rejoin", ev["time"], attempts, logs, records, until,
                                           want_world=expect.rejoin_world, detect=False))
        else:
            res.recoveries.append(recovery(ev["label"], ev["time"], attempts, logs, records, until))
    checks = res.checks
    if res.error:
        checks.append(Check("ran to the end", False, res.error.splitlines()[0][:300]))
    disrupted = {name for e in res.events for name in e.get("agents_hit", [])}
    effective: list[dict] = []
    try:
        effective = effective_steps(attempts)
    except ChainError as e:
        checks.append(Check("consistent history", False, str(e)))
    res.useful_s, res.goodput = goodput(effective, res.wall_s)
    if expect.outcome == "fail":
        codes = {k: v for k, v in res.exit_codes.items()}
        ok = codes and all(v not in (0, None) for v in codes.values())
        checks.append(Check("job stopped with non-zero exit", bool(ok), f"exit codes {codes}"))
    else:
        clean = {k: v for k, v in res.exit_codes.items() if k not in disrupted}
        checks.append(Check("agents exited 0", bool(clean) and all(v == 0 for v in clean.values()),
                            f"exit codes {res.exit_codes} (disrupted: {sorted(disrupted) or 'none'})"))
        final = run.ckpt / f"step_{cfg.steps:08d}"
        ended = any(r.get("event") == "end" for r in records)
        checks.append(Check("completed", ended and (final / MARKER).exists(),
                            f"end event: {ended}, final checkpoint {final.name}: {(final / MARKER).exists()}"))
        problems = exactly_once(effective, cfg.global_batch, cfg.steps) if effective else ["no effective steps"]
        checks.append(Check("every sample exactly once", not problems, "; ".join(problems[:3]) or
                            f"{cfg.steps} effective steps cover samples [0, {cfg.steps * cfg.global_batch})"))
        if (final / MARKER).exists():
            from training.compare import compare
            atol = 0.0 if expect.outcome == "bitwise" else cfg.atol
            try:
                diffs = compare(final, ref.final, atol)
            except ValueError as e:
                diffs = [str(e)]
            name = "weights bitwise == reference" if atol == 0 else f"weights within {atol:g} of reference"
            checks.append(Check(name, not diffs, f"{len(diffs)} differing tensors: {diffs[:2]}" if diffs
                                else "model + optimizer state equal"))
        dl = max_loss_diff(effective, ref.effective)
        if expect.outcome == "bitwise" and dl is not None:
            checks.append(Check("losses == reference", dl == 0.0, f"max |loss diff| {dl:.3g}"))
        elif dl is not None:
            checks.append(Check("losses close to reference", dl < 1e-3, f"max |loss diff| {dl:.3g}"))
    for fn in expect.checks:
        try:
            checks.append(fn())
        except Exception as e:  # noqa: BLE001
            checks.append(Check(getattr(fn, "__name__", "check"), False, f"{type(e).__name__}: {e}"))
    res.passed = bool(checks) and all(c.ok for c in checks)

"""Chaos test on a real Slurm cluster (the local lab by default): ``make chaos-test PLATFORM=slurm``.

Runs the debug job on 2 nodes with checkpoints on the shared directory, once without faults (the reference,
cached by config and training code) and once per scenario:

  a  kill one node outright (every process, link unplugged): Slurm marks it DOWN and requeues the job; the
     node is revived; the job resumes from the last complete checkpoint and finishes
  b  kill only the training worker processes on one node: torchrun restarts the worker group inside the
     allocation, no requeue
  c  the pre-timeout signal (SIGUSR1 to the batch script, as Slurm's --signal=B:USR1@T sends it): the job
     checkpoints, requeues itself and finishes with no step lost

Verdict per scenario: the job completed, its final weights are bitwise equal to the reference's (same world
size), and the scenario's expectations hold (requeues, restarts, steps lost). Prints a table and writes
report.json. Exit 0 when every scenario passed, 1 otherwise, 2 for a bad setting, 3 when the lab can't run.

Definitions: time to detect = fault -> first sign the system noticed (a: Slurm marks the node DOWN;
b: a torchrun agent logs the failed worker group; c: the job logs the signal); time to recover = fault ->
first step completed by an attempt that started after the fault; steps lost = last step completed before
that attempt started - the step it resumed from.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from tools.slurm import slurmctl
from cluster_assets.slurm.config import REPO_DIR, SlurmJobConfig
from cluster_assets.slurm.render import render

LAB_DIR = Path(__file__).resolve().parents[1] / "testbed" / "slurm_lab"
SCENARIOS = {
    "a": "kill a node outright -> DOWN, requeue, revive, resume",
    "b": "kill the training processes on a node -> torchrun restart, no requeue",
    "c": "pre-timeout signal -> checkpoint, self-requeue, 0 steps lost",
}
# torchrun agent lines that mean "a worker failure was noticed" (as in the local chaos harness)
DETECT_RE = re.compile(r"failed \(exitcode|Worker group (FAILED|UNHEALTHY)|will restart worker group")


def say(msg: str) -> None:
    print(f"[chaos-slurm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class ChaosConfig:
    """Settings of one chaos run."""

    scenarios: str = "abc"
    """Scenario letters to run, in order."""
    nodes: int = 2
    """Nodes per job (the lab is brought up with this many)."""
    preset: str = "debug"
    """Training preset."""
    steps: int = 12
    """Training steps per job: small, so that every scenario finishes in about a minute."""
    interval: int = 2
    """Checkpoint interval (steps); steps lost on a crash are at most this."""
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
    """Base port of the jobs' rendezvous store (+ job id % 1000); change it when labs run side by side."""
    kill_node: str = "last"
    """Which node of the allocation scenarios a/b hit: last (not the batch host) or first (the batch host
    and rendezvous store)."""

    def validate(self) -> None:
        bad = [s for s in self.scenarios if s not in SCENARIOS]
        if bad or not self.scenarios:
            raise ValueError(f"--scenarios {self.scenarios!r}: use letters from {''.join(SCENARIOS)}")
        if self.nodes < 2:
            raise ValueError(f"--nodes {self.nodes}: node faults need at least 2 nodes")
        if not 1 <= self.interval < self.fault_step < self.steps:
            raise ValueError(f"need 1 <= interval ({self.interval}) < fault step ({self.fault_step}) < steps "
                             f"({self.steps}) so that a checkpoint exists before the fault and work remains after it")
        if self.kill_node not in ("first", "last"):
            raise ValueError(f"--kill-node {self.kill_node!r}: use first or last")

    @property
    def job_train_args(self) -> tuple[str, ...]:
        return ("--train.steps", str(self.steps), "--train.warmup_steps", str(min(2, self.steps)),
                "--checkpoint.interval", str(self.interval), "--checkpoint.keep_last", "3",
                "--metrics.log_every", "1", *self.train_args)


# ------------------------------------------------------------------------------------------- lab control
class Lab:
    """The lab's scripts, run with this run's SLAB_* environment."""

    def __init__(self, root: str, nodes: int):
        self.root = Path(root)
        self.env = dict(os.environ, SLAB_ROOT=str(self.root), SLAB_NODES=str(nodes))
        self.env.pop("SLURM_CONF", None)
        self.started_here = False

    def _run(self, script: str, *args: str, timeout: float = 180, check: bool = True) -> str:
        out = subprocess.run([str(LAB_DIR / script), *args], env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"lab {script} {' '.join(args)} failed ({out.returncode}): "
                               f"{(out.stderr or out.stdout).strip()[-2000:]}")
        return out.stdout

    def up(self) -> None:
        was_up = subprocess.run([str(LAB_DIR / "status.sh")], env=self.env, capture_output=True).returncode == 0
        t0 = time.monotonic()
        self._run("up.sh", timeout=600)
        self.started_here = not was_up
        say(f"lab {'already up' if was_up else f'up in {time.monotonic() - t0:.1f} s'} "
            f"({(self.root / 'run' / 'settings').read_text().strip()})")
        self.env["SLURM_CONF"] = str(self.root / "etc" / "slurm.conf")

    def down(self) -> None:
        self._run("down.sh", check=False)

    def fault(self, cmd: str, node: str) -> str:
        return self._run("fault.sh", cmd, node)

    def fault_async(self, cmd: str, node: str) -> subprocess.Popen:
        return subprocess.Popen([str(LAB_DIR / "fault.sh"), cmd, node], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def worker_pids(self, node: str) -> set[int]:
        """torchrun worker processes (they carry TORCHELASTIC_RESTART_COUNT) on a node."""
        pids = set()
        for p in self.fault("pids", node).split():
            try:
                env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(b"TORCHELASTIC_RESTART_COUNT=") for e in env):
                pids.add(int(p))
        return pids


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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


def parse_metrics(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line of a killed writer
            continue
    return out


@dataclass
class Outcome:
    """One job's observed course and figures (times are seconds after the fault)."""

    scenario: str
    description: str
    job_id: int = 0
    final_state: str = ""
    exit_code: str = ""
    requeues: int = 0
    torchrun_restarts: int = 0
    fault_node: str = ""
    fault_after_step: int | None = None
    detect_s: float | None = None
    recover_s: float | None = None
    steps_lost: int | None = None
    resumed_from: int | None = None
    newest_committed: int | None = None
    wall_s: float = 0.0
    bitwise_equal: bool | None = None
    compare_output: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(self.checks.values())


def analyse(out: Outcome, records: list[dict], t_fault: float | None) -> None:
    """Fill recover_s, steps_lost, resumed_from, torchrun_restarts from the metrics records."""
    starts = [r for r in records if r.get("event") == "start"]
    out.torchrun_restarts = max((int(r.get("restart_count") or 0) for r in starts), default=0)
    if t_fault is None:
        return
    after = [r for r in starts if r["time"] > t_fault]
    if not after:
        return
    rec_start = after[0]
    out.resumed_from = rec_start.get("resumed_from") or 0
    before = [r["step"] for r in records if r.get("event") == "step" and r["time"] < rec_start["time"]]
    out.steps_lost = max(before, default=0) - out.resumed_from
    committed = [r["step"] for r in records if r.get("event") == "checkpoint" and r["time"] < rec_start["time"]]
    out.newest_committed = max(committed, default=0)
    first = next((r for r in records if r.get("event") == "step" and r["time"] > rec_start["time"]), None)
    if first:
        out.recover_s = round(first["time"] - t_fault, 2)


class Runner:
    def __init__(self, cfg: ChaosConfig, lab: Lab, out_dir: Path):
        self.cfg, self.lab, self.out_dir = cfg, lab, out_dir
        self.shared = Path(cfg.work_dir) / "shared"
        # this interpreter: the project venv (scripts/venv.sh), on a file system every lab node sees
        self.python = sys.executable

    def job_config(self, run_name: str) -> SlurmJobConfig:
        return SlurmJobConfig(run_name=run_name, preset=self.cfg.preset, train_args=self.cfg.job_train_args,
                              nodes=self.cfg.nodes, shared_dir=str(self.shared), repo_dir=str(REPO_DIR),
                              python=self.python, slurm_conf=self.lab.env["SLURM_CONF"], max_requeues=3,
                              max_restarts=3, shutdown_timeout_s=60, rdzv_port=self.cfg.rdzv_port,
                              step_timeout_s=int(self.cfg.scenario_timeout_s) + 60)

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
            if p.suffix in (".py", ".toml") and "chaos" not in p.parts:
                h.update(p.relative_to(REPO_DIR).as_posix().encode())
                h.update(p.read_bytes())
        return h.hexdigest()[:12]

    def reference(self) -> tuple[SlurmJobConfig, float | None]:
        """The uninterrupted run, via scripts/train_slurm.sh (cached by config + training code)."""
        job = self.job_config(f"reference-{self.reference_key()}")
        final = self.final_checkpoint(job)
        if (final / "COMMITTED.json").is_file():
            say(f"reference: cached ({final})")
            return job, None
        self.fresh(job)
        t0 = time.monotonic()
        say(f"reference: uninterrupted run via scripts/train_slurm.sh ({self.cfg.steps} steps, {self.cfg.nodes} nodes)")
        log = self.out_dir / "reference.log"
        with open(log, "w") as f:
            rc = subprocess.run(
                [str(REPO_DIR / "scripts" / "train_slurm.sh"), "--run-name", job.run_name, "--shared-dir",
                 str(self.shared), "--nodes", str(self.cfg.nodes), "--preset", self.cfg.preset,
                 "--python", self.python, "--max-restarts", "0", "--no-requeue", "--rdzv-port", str(job.rdzv_port),
                 "--step-timeout", str(job.step_timeout_s), "--follow-timeout", str(self.cfg.scenario_timeout_s),
                 "--", *self.cfg.job_train_args],
                env=self.lab.env, stdout=f, stderr=subprocess.STDOUT, timeout=self.cfg.scenario_timeout_s + 120,
            ).returncode
        if rc != 0 or not (final / "COMMITTED.json").is_file():
            raise RuntimeError(f"reference run failed (exit {rc}); see {log}")
        starts = [r for r in parse_metrics(Path(job.metrics_path).read_text().splitlines()) if r.get("event") == "start"]
        if len(starts) != 1:
            shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
            raise RuntimeError(f"the reference run was interrupted ({len(starts)} starts); see {log}")
        wall = time.monotonic() - t0
        say(f"reference: done in {wall:.0f} s")
        return job, wall

    # ---------------------------------------------------------------- one scenario
    def scenario(self, letter: str, ref: SlurmJobConfig) -> Outcome:
        out = Outcome(scenario=letter, description=SCENARIOS[letter])
        job = self.job_config(f"chaos-{letter}")
        self.fresh(job)
        t_start = time.monotonic()
        out.job_id = jid = self.submit(job)
        say(f"{letter}: {SCENARIOS[letter]}: job {jid}")
        metrics, log = Tail(Path(job.metrics_path)), Tail(Path(job.log_pattern.replace("%j", str(jid))))
        records: list[dict] = []
        t_fault: float | None = None
        watch: dict = {}
        deadline = t_start + self.cfg.scenario_timeout_s
        info = None
        try:
            while time.monotonic() < deadline:
                records += parse_metrics([line for _, line in metrics.read()])
                loglines = log.read()
                info = slurmctl.job_info(jid, env=self.lab.env)
                if info is None:
                    raise RuntimeError(f"job {jid} vanished from slurmctld")
                last_step = max((r["step"] for r in records if r.get("event") == "step"), default=0)
                if t_fault is None and info.state == "RUNNING" and last_step >= self.cfg.fault_step:
                    t_fault = self.inject(letter, out, info, last_step, watch)
                elif t_fault is not None and out.detect_s is None:
                    t = self.detected(letter, watch, loglines, records, t_fault)
                    if t is not None:
                        out.detect_s = round(t - t_fault, 2)
                        out.events.append({"event": "detected", "time": t})
                        say(f"{letter}: detected after {out.detect_s:.1f} s")
                if t_fault is not None:
                    self.after_fault(letter, watch, info, out)
                if info.terminal:
                    break
                time.sleep(0.25)
            else:
                out.error = f"timed out after {self.cfg.scenario_timeout_s:.0f} s (job {jid} {info.state if info else '?'})"
                slurmctl.scancel(jid, env=self.lab.env)
        except BaseException as e:  # noqa: BLE001 - one scenario's failure is reported, the others still run
            out.error = f"{type(e).__name__}: {e}"
            try:
                slurmctl.scancel(jid, env=self.lab.env)
            except slurmctl.SlurmError:
                pass
            if not isinstance(e, Exception):  # Ctrl-C: the job is cancelled, the node revived, then stop
                raise
        finally:
            reviver = watch.get("reviver")
            if reviver is not None:
                reviver.wait(timeout=120)
            if watch.get("killed_node") and not watch.get("revived"):
                self.lab.fault("revive", watch["killed_node"])  # leave the lab whole for the next scenario
        time.sleep(0.5)
        records += parse_metrics([line for _, line in metrics.read()])
        out.wall_s = round(time.monotonic() - t_start, 1)
        if info is not None:
            out.final_state, out.exit_code, out.requeues = info.state, info.exit_code, info.restarts
        analyse(out, records, t_fault)
        if t_fault is None and not out.error:
            out.error = f"the job ended before step {self.cfg.fault_step}; no fault was injected"
        self.verdict(letter, out, job, ref)
        return out

    def inject(self, letter: str, out: Outcome, info: slurmctl.JobInfo, last_step: int, watch: dict) -> float:
        hosts = slurmctl.run(["scontrol", "show", "hostnames", info.node_list], env=self.lab.env).split()
        node = hosts[-1] if self.cfg.kill_node == "last" else hosts[0]
        out.fault_after_step = last_step
        watch["restarts0"] = info.restarts
        if letter == "a":
            out.fault_node = watch["killed_node"] = node
            t = time.time()
            self.lab.fault("kill-node", node)
            say(f"a: killed node {node} after step {last_step}")
        elif letter == "b":
            out.fault_node = node
            t = time.time()
            self.lab.fault("kill-workers", node)
            say(f"b: killed the training processes on {node} after step {last_step}")
        else:
            out.fault_node = info.batch_host
            t = time.time()
            slurmctl.scancel(info.job_id, signal="USR1", batch=True, env=self.lab.env)
            say(f"c: sent SIGUSR1 to the batch script (as --signal=B:USR1@T does) after step {last_step}")
        out.events.append({"event": "fault", "time": t, "node": out.fault_node, "after_step": last_step})
        return t

    def detected(self, letter: str, watch: dict, loglines: list[tuple[float, str]], records: list[dict],
                 t_fault: float) -> float | None:
        if letter == "a":
            state = slurmctl.node_states(env=self.lab.env).get(watch["killed_node"], "")
            return time.time() if state.startswith("DOWN") else None
        if letter == "b":
            return next((t for t, line in loglines if t >= t_fault and DETECT_RE.search(line)), None)
        return next((t for t, line in loglines if t >= t_fault and "SIGUSR1" in line), None)

    def after_fault(self, letter: str, watch: dict, info: slurmctl.JobInfo, out: Outcome) -> None:
        if info.restarts > watch["restarts0"] and "requeued" not in watch:
            watch["requeued"] = time.time()
            out.events.append({"event": "requeued", "time": watch["requeued"]})
            say(f"{letter}: job requeued (restart {info.restarts})")
        if letter == "a" and out.detect_s is not None and "reviver" not in watch:
            watch["reviver"] = self.lab.fault_async("revive", watch["killed_node"])
            say(f"a: reviving {watch['killed_node']}")
        rv = watch.get("reviver")
        if rv is not None and not watch.get("revived") and rv.poll() is not None:
            watch["revived"] = True
            out.events.append({"event": "revived", "time": time.time(), "rc": rv.returncode})
            if rv.returncode != 0:
                raise RuntimeError(f"reviving {watch['killed_node']} failed: {rv.stdout.read()[-1000:]}")
            say(f"a: {watch['killed_node']} is back")

    def verdict(self, letter: str, out: Outcome, job: SlurmJobConfig, ref: SlurmJobConfig) -> None:
        c = out.checks
        c["job completed"] = out.final_state == "COMPLETED" and out.exit_code == "0:0"
        if c["job completed"]:
            cmp = subprocess.run([self.python, "-m", "training.compare", str(self.final_checkpoint(ref)),
                                  str(self.final_checkpoint(job))], capture_output=True, text=True, cwd=REPO_DIR,
                                 timeout=300)
            out.compare_output = (cmp.stdout + cmp.stderr).strip()[-2000:]
            out.bitwise_equal = cmp.returncode == 0
        c["final weights bitwise equal to the reference"] = bool(out.bitwise_equal)
        c["resumed from the newest complete checkpoint"] = \
            out.resumed_from is not None and out.resumed_from == out.newest_committed
        # async saves: one save may still be in flight when the fault hits, so the bound is 2 intervals
        lost_ok = out.steps_lost is not None and out.steps_lost < 2 * self.cfg.interval
        if letter == "a":
            c["Slurm detected the dead node and requeued the job"] = out.detect_s is not None and out.requeues >= 1
            c[f"steps lost < 2 x checkpoint interval ({self.cfg.interval})"] = lost_ok
        elif letter == "b":
            c["torchrun restarted the workers"] = out.torchrun_restarts >= 1
            c["no requeue"] = out.requeues == 0
            c[f"steps lost < 2 x checkpoint interval ({self.cfg.interval})"] = lost_ok
        else:
            c["the job requeued itself"] = out.requeues >= 1
            c["0 steps lost"] = out.steps_lost == 0
        say(f"{letter}: {'PASS' if out.passed else 'FAIL'} ({out.final_state} {out.exit_code}, {out.wall_s:.0f} s)"
            + "".join(f"\n    {'ok ' if v else 'NO '} {k}" for k, v in c.items())
            + (f"\n    error: {out.error}" if out.error else ""))


# ------------------------------------------------------------------------------------------------ report
def table(outcomes: list[Outcome]) -> str:
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)
    rows = [("scenario", "result", "detect s", "recover s", "steps lost", "requeues", "torchrun restarts",
             "bitwise", "wall s")]
    for o in outcomes:
        rows.append((f"{o.scenario}: {o.description.split(' ->')[0]}", "PASS" if o.passed else "FAIL",
                     f(o.detect_s), f(o.recover_s), f(o.steps_lost, "{}"), str(o.requeues),
                     str(o.torchrun_restarts), {True: "equal", False: "DIFFERENT", None: "-"}[o.bitwise_equal],
                     f(o.wall_s, "{:.0f}")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(cfg: ChaosConfig, out_dir: Path, progress: Callable[[str], None] = say) -> dict:
    cfg.validate()
    out_dir.mkdir(parents=True, exist_ok=True)
    lab = Lab(cfg.lab_root, cfg.nodes)
    t0 = time.monotonic()
    lab.up()
    report: dict = {"config": asdict(cfg), "lab": (Path(cfg.lab_root) / "run" / "settings").read_text().strip()}
    try:
        runner = Runner(cfg, lab, out_dir)
        ref, ref_wall = runner.reference()
        report["reference"] = {"checkpoint": str(runner.final_checkpoint(ref)), "wall_s": ref_wall,
                               "cached": ref_wall is None}
        outcomes = [runner.scenario(letter, ref) for letter in cfg.scenarios]
    finally:
        if lab.started_here and not cfg.keep_lab:
            lab.down()
            progress("lab: down (this run started it)")
    report["scenarios"] = [{**asdict(o), "passed": o.passed} for o in outcomes]
    report["passed"] = all(o.passed for o in outcomes)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["table"] = table(outcomes)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    return report


def preflight() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm lab needs root (munge, slurmd, network namespaces)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "Slurm is not installed and there is no apt-get to install it"
    return None


def build_parser() -> argparse.ArgumentParser:
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="python -m chaos.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=d.scenarios, help=f"letters to run (default {d.scenarios})")
    p.add_argument("--nodes", type=int, default=int(os.environ.get("NODES") or d.nodes), help="nodes (env NODES; 2)")
    p.add_argument("--preset", default=os.environ.get("PRESET") or d.preset, help="training preset (default debug)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"steps per job (default {d.steps})")
    p.add_argument("--interval", type=int, default=d.interval, help=f"checkpoint interval (default {d.interval})")
    p.add_argument("--fault-step", type=int, default=d.fault_step, help=f"fault after this step (default {d.fault_step})")
    p.add_argument("--kill-node", choices=["last", "first"], default=d.kill_node,
                   help="node hit by a/b: last (default) or first (batch host + rendezvous store)")
    p.add_argument("--work-dir", default=d.work_dir, help=f"shared dir for jobs + reports (default {d.work_dir})")
    p.add_argument("--lab-root", default=os.environ.get("SLAB_ROOT") or d.lab_root,
                   help="lab root (env SLAB_ROOT; other SLAB_* settings are read from the environment)")
    p.add_argument("--keep-lab", action="store_true", help="leave a lab this run started running")
    p.add_argument("--rdzv-port", type=int, default=d.rdzv_port, help=f"rendezvous base port (default {d.rdzv_port})")
    p.add_argument("--scenario-timeout", type=float, default=d.scenario_timeout_s, help="seconds per scenario")
    p.add_argument("--out", type=Path, help="report directory (default <work-dir>/reports/<time>)")
    p.add_argument("train_args", nargs="*", help="after --: extra training flags for every job")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = ChaosConfig(scenarios=a.scenarios, nodes=a.nodes, preset=a.preset, steps=a.steps, interval=a.interval,
                      fault_step=a.fault_step, train_args=tuple(a.train_args), work_dir=os.path.abspath(a.work_dir),
                      lab_root=os.path.abspath(a.lab_root), keep_lab=a.keep_lab,
                      scenario_timeout_s=a.scenario_timeout, kill_node=a.kill_node, rdzv_port=a.rdzv_port)
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
    report = run(cfg, out_dir)
    print()
    print(report["table"])
    print(f"\n{'PASS' if report['passed'] else 'FAIL'}: {sum(s['passed'] for s in report['scenarios'])}/"
          f"{len(report['scenarios'])} scenarios in {report['wall_s']:.0f} s; report {out_dir / 'report.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Elastic launcher: one torchrun command line for this machine, Slurm and Kubeflow Trainer.

Every platform goes through the same typed :class:`LaunchConfig` and the same :func:`torchrun_argv`, so the
local multi-node run exercises exactly the torchrun arguments the clusters use:

* ``--nnodes=MIN:MAX`` elastic membership, ``--max-restarts`` for worker failures;
* c10d rendezvous with tuned timeouts (``--rdzv-conf``) and a fast keep-alive, so a lost node is noticed in
  seconds instead of ~50 s;
* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: works around a torch 2.13 deadlock when a node joins a later
  rendezvous round (pytorch#147064);
* the rendezvous store can live outside every training node (``is_host=false`` against
  ``python -m training.rdzv_store``), so the job survives losing *any* node, including rank 0's;
* a short process-group timeout after the first step (``--parallel.train_timeout_s``) so a hung peer is
  detected in seconds, not the 10-30 minute defaults.

Usage::

    python -m training.launch [--from-env local|slurm|pet] [options] [-- TRAINING ARGS]
    python -m training.launch --nodes 2 -- --preset debug --train.steps 20      # 2 simulated nodes here
    python -m training.launch --from-env slurm --print -- --preset t5-base       # show, don't run
    srun --ntasks-per-node=1 python -m training.launch --from-env slurm -- --preset t5-base
    # Kubeflow Trainer container `node`:  python -m training.launch --from-env pet -- --preset t5-base

Environment read by the mappings (flags win over environment):

* local: NODES (default 2), NPROC (default 1); starts its own rendezvous store unless --rdzv-endpoint.
* slurm: SLURM_JOB_NUM_NODES, SLURM_NODEID, SLURM_JOB_ID, SLURM_RESTART_COUNT, SLURM_JOB_NODELIST
  (first host via ``scontrol show hostnames``), SLURM_GPUS_ON_NODE.
* pet (Kubeflow Trainer v2 torch plugin): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT.
* all: T5_RDZV_ENDPOINT (HOST:PORT of a standalone store -> is_host=false), T5_RDZV_ID, T5_MIN_NODES.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

DEFAULT_RDZV_PORT = 29400
# torch 2.13: a node joining a later rendezvous round deadlocks while agents share the rendezvous TCPStore
# with their workers (pytorch#147064). With this set, each round's rank-0 worker hosts its own store.
RDZV_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


class LaunchError(ValueError):
    """A bad launch setting or a missing cluster variable; the message names it and the fix."""


@dataclass(frozen=True)
class RdzvTuning:
    """c10d dynamic-rendezvous timing (seconds), passed as ``--rdzv-conf``.

    Defaults were measured on loopback (STACK-NOTES §3): node loss 49.5 s -> ~12 s to the next step.

    Attributes:
        last_call_timeout: after MIN nodes joined, wait this long for more before closing the round.
        close_timeout: how long closing the rendezvous may take.
        join_timeout: how long a round may wait to reach MIN nodes (a replacement node's boot time).
        read_timeout: store read timeout for rendezvous operations.
        keep_alive_interval: agent heartbeat period.
        keep_alive_max_attempt: missed heartbeats before a node is declared dead
            (node-loss detection = interval x attempts).
    """

    last_call_timeout: int = 3
    close_timeout: int = 10
    join_timeout: int = 120
    read_timeout: int = 30
    keep_alive_interval: int = 1
    keep_alive_max_attempt: int = 3


@dataclass(frozen=True)
class LaunchConfig:
    """Everything that decides one torchrun agent's command line.

    Attributes:
        min_nodes: fewest nodes the job keeps training with (MIN of ``--nnodes``); below it, it waits up
            to ``tuning.join_timeout`` for replacements. ``min_nodes == max_nodes`` = fixed-size job.
        max_nodes: nodes the job grows back to (MAX of ``--nnodes``).
        nproc_per_node: worker processes per node (int, or torchrun's "gpu"/"cpu"/"auto").
        rdzv_endpoint: HOST:PORT of the rendezvous store.
        rdzv_id: job identity in the store; all agents of one job attempt share it. A relaunch after the
            job ended (requeue) should use a new id: a finished job closes its rendezvous for good.
        external_store: True when ``rdzv_endpoint`` is a standalone store no training node hosts
            (``python -m training.rdzv_store``); agents then only connect (``is_host=false``). False:
            the agent on the endpoint host serves the store (plain c10d; the job dies with that node).
        max_restarts: worker-group restarts per agent before the job fails (node joins don't count).
        tuning: rendezvous timeouts and keep-alive.
        shutdown_timeout_s: seconds an agent waits after SIGTERM-ing its workers before SIGKILL; must
            cover a checkpoint-on-signal.
        train_timeout_s: process-group timeout after the first step (hang detection), passed to the
            training core as ``--parallel.train_timeout_s`` unless the training args set it; 0 = don't.
        node_rank: this node's index as the cluster numbers it (informational: elastic rendezvous
            assigns ranks; exported as T5_NODE_RANK for logs).
        module: Python module each worker runs (``torchrun --module``).
        train_args: arguments for the training module.
        python: interpreter that runs torchrun (``python -m torch.distributed.run``).
    """

    min_nodes: int = 1
    max_nodes: int = 2
    nproc_per_node: int | str = 1
    rdzv_endpoint: str = f"127.0.0.1:{DEFAULT_RDZV_PORT}"
    rdzv_id: str = "t5-local"
    external_store: bool = True
    max_restarts: int = 3
    tuning: RdzvTuning = field(default_factory=RdzvTuning)
    shutdown_timeout_s: int = 30
    train_timeout_s: int = 30
    node_rank: int | None = None
    module: str = "training"
    train_args: tuple[str, ...] = ()
    python: str = sys.executable

    def validate(self) -> None:
        """Raise :class:`LaunchError` naming the bad value and the fix."""
        if self.min_nodes < 1:
            raise LaunchError(f"min nodes {self.min_nodes} < 1: use --min-nodes 1 or more")
        if self.max_nodes < self.min_nodes:
            raise LaunchError(f"max nodes {self.max_nodes} < min nodes {self.min_nodes}: "
                              f"lower --min-nodes or raise --nodes")
        if isinstance(self.nproc_per_node, int):
            if self.nproc_per_node < 1:
                raise LaunchError(f"--nproc-per-node {self.nproc_per_node} < 1")
        elif self.nproc_per_node not in ("gpu", "cpu", "auto"):
            raise LaunchError(f"--nproc-per-node {self.nproc_per_node!r}: use an integer, gpu, cpu or auto")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise LaunchError(f"rendezvous endpoint {self.rdzv_endpoint!r} is not HOST:PORT "
                              f"(e.g. 127.0.0.1:{DEFAULT_RDZV_PORT})")
        if not self.rdzv_id or any(c.isspace() or c in ",=" for c in self.rdzv_id):
            raise LaunchError(f"rendezvous id {self.rdzv_id!r} must be non-empty without spaces, ',' or '='")
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts} < 0")
        if self.shutdown_timeout_s < 1:
            raise LaunchError(f"--shutdown-timeout {self.shutdown_timeout_s} < 1 s")
        if self.train_timeout_s < 0:
            raise LaunchError(f"--train-timeout-s {self.train_timeout_s} < 0 (0 = leave to the training config)")
        if self.tuning.join_timeout < 1:
            raise LaunchError(f"--join-timeout {self.tuning.join_timeout} < 1 s: give a replacement node "
                              f"time to boot (default 120)")


# ----------------------------------------------------------------------------------------- argv building
def rdzv_conf(cfg: LaunchConfig) -> str:
    """The ``--rdzv-conf`` value: tuned timeouts, keep-alive, and ``is_host=false`` for an external store."""
    t = cfg.tuning
    parts = [f"last_call_timeout={t.last_call_timeout}", f"close_timeout={t.close_timeout}",
             f"join_timeout={t.join_timeout}", f"read_timeout={t.read_timeout}",
             f"keep_alive_interval={t.keep_alive_interval}", f"keep_alive_max_attempt={t.keep_alive_max_attempt}"]
    if cfg.external_store:
        parts.append("is_host=false")
    return ",".join(parts)


def training_argv(cfg: LaunchConfig) -> list[str]:
    """The training module's arguments, plus the short process-group timeout unless already given."""
    args = list(cfg.train_args)
    given = any(a == "--parallel.train_timeout_s" or a.startswith("--parallel.train_timeout_s=") for a in args)
    if cfg.train_timeout_s and not given:
        args += ["--parallel.train_timeout_s", str(cfg.train_timeout_s)]
    return args


def torchrun_argv(cfg: LaunchConfig) -> list[str]:
    """One agent's full command line (pure: depends only on ``cfg``)."""
    cfg.validate()
    return [cfg.python, "-m", "torch.distributed.run",
            f"--nnodes={cfg.min_nodes}:{cfg.max_nodes}",
            f"--nproc-per-node={cfg.nproc_per_node}",
            f"--max-restarts={cfg.max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
            f"--rdzv-id={cfg.rdzv_id}",
            f"--rdzv-conf={rdzv_conf(cfg)}",
            f"--shutdown-timeout={cfg.shutdown_timeout_s}",
            "--module", cfg.module,
            *training_argv(cfg)]


def launch_env(cfg: LaunchConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for an agent: ``base`` (default os.environ) plus the rendezvous workaround."""
    env = dict(os.environ if base is None else base)
    env.update(RDZV_ENV)
    env.setdefault("PYTHONUNBUFFERED", "1")  # timely logs: the chaos harness timestamps lines as they come
    if cfg.node_rank is not None:
        env["T5_NODE_RANK"] = str(cfg.node_rank)
    return env


def store_argv(port: int, port_file: str | None = None, python: str = sys.executable) -> list[str]:
    """Command line of the standalone rendezvous store (``training.rdzv_store``)."""
    argv = [python, "-m", "training.rdzv_store", "--port", str(port)]
    if port_file:
        argv += ["--port-file", port_file]
    return argv


def format_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Shell-quoted command line, prefixed with the rendezvous env vars it needs."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)


# ------------------------------------------------------------------------------------- env -> LaunchConfig
def _int_env(env: Mapping[str, str], name: str, hint: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        raise LaunchError(f"{name} is not set: {hint}")
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r} is not an integer: {hint}") from None


def _nnodes(raw: str, name: str) -> tuple[int | None, int]:
    """Parse ``N`` or ``MIN:MAX``; returns (min or None, max)."""
    try:
        if ":" in raw:
            lo, hi = raw.split(":", 1)
            return int(lo), int(hi)
        return None, int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r}: expected N or MIN:MAX") from None


def expand_first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression without Slurm (``node[03-05,9],gpu1`` -> ``node03``).

    Fallback when ``scontrol`` is not installed; handles the common prefix[ranges] forms.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise LaunchError("SLURM_JOB_NODELIST is empty")
    depth = 0
    for i, c in enumerate(nodelist):  # the first top-level comma ends the first entry
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            nodelist = nodelist[:i]
            break
    if "[" not in nodelist:
        return nodelist
    prefix, rest = nodelist.split("[", 1)
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    return prefix + first + (rest.split("]", 1)[1] if "]" in rest else "")


def slurm_first_host(nodelist: str, scontrol: str | None = None) -> str:
    """First host of SLURM_JOB_NODELIST via ``scontrol show hostnames`` (Slurm's own expansion)."""
    scontrol = scontrol or shutil.which("scontrol")
    if not scontrol:
        return expand_first_host(nodelist)
    out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    hosts = out.stdout.split()
    if out.returncode != 0 or not hosts:
        # e.g. no slurm.conf reachable from this shell; the hostlist grammar is simple enough to expand here
        last = (out.stderr.strip().splitlines() or ["no hosts"])[-1]
        print(f"[launch] warning: scontrol show hostnames {nodelist!r} failed ({last}); "
              f"expanding it without Slurm", file=sys.stderr)
        return expand_first_host(nodelist)
    return hosts[0]


def _common(env: Mapping[str, str], default_endpoint: str, default_id: str) -> dict:
    """Overrides every mapping honours: an external store, an explicit id, the MIN of --nnodes."""
    ext = env.get("T5_RDZV_ENDPOINT", "")
    out: dict = {"rdzv_endpoint": ext or default_endpoint, "external_store": bool(ext),
                 "rdzv_id": env.get("T5_RDZV_ID") or default_id}
    if env.get("T5_MIN_NODES"):
        out["min_nodes"] = _int_env(env, "T5_MIN_NODES", "set it to the fewest nodes to keep training with")
    return out


def config_from_slurm(env: Mapping[str, str], first_host: Callable[[str], str] = slurm_first_host) -> LaunchConfig:
    """Map a Slurm allocation (one launcher per node, e.g. ``srun --ntasks-per-node=1``) to a LaunchConfig.

    The rendezvous id includes SLURM_RESTART_COUNT so a requeued job starts a fresh rendezvous.
    Without T5_RDZV_ENDPOINT the first allocated host serves the store (plain c10d).
    """
    hint = "run inside an sbatch/salloc allocation (srun --ntasks-per-node=1 python -m training.launch ...)"
    nnodes = _int_env(env, "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES", hint)
    job = _int_env(env, "SLURM_JOB_ID", hint)
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError(f"SLURM_JOB_NODELIST is not set: {hint}")
    node_rank = _int_env(env, "SLURM_NODEID", hint)
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    common = _common(env, f"{first_host(nodelist)}:{env.get('T5_RDZV_PORT', DEFAULT_RDZV_PORT)}",
                     f"slurm-{job}" + (f"-r{restart}" if restart else ""))
    return LaunchConfig(max_nodes=nnodes, nproc_per_node=int(gpus) if gpus.isdigit() and int(gpus) > 0 else 1,
                        node_rank=node_rank, **common)


def config_from_pet(env: Mapping[str, str]) -> LaunchConfig:
    """Map the Kubeflow Trainer v2.3 torch plugin's ``PET_*`` variables (container ``node``) to a LaunchConfig.

    PET_MASTER_ADDR is ``<job>-node-0-0.<job>``: the part after the first dot (the TrainJob name) is the
    rendezvous id unless T5_RDZV_ID is set. Without T5_RDZV_ENDPOINT node 0 serves the store.
    """
    hint = "this mapping runs inside a Kubeflow TrainJob pod (torch runtime, container 'node')"
    raw = env.get("PET_NNODES")
    if not raw:
        raise LaunchError(f"PET_NNODES is not set: {hint}")
    lo, hi = _nnodes(raw, "PET_NNODES")
    nproc_raw = env.get("PET_NPROC_PER_NODE", "1")
    nproc: int | str = int(nproc_raw) if nproc_raw.isdigit() else nproc_raw
    node_rank = _int_env(env, "PET_NODE_RANK", hint)
    addr = env.get("PET_MASTER_ADDR")
    if not addr:
        raise LaunchError(f"PET_MASTER_ADDR is not set: {hint}")
    port = _int_env(env, "PET_MASTER_PORT", hint)
    job = addr.split(".", 1)[1].split(".", 1)[0] if "." in addr else addr
    common = _common(env, f"{addr}:{port}", f"trainjob-{job}")
    common.setdefault("min_nodes", lo if lo is not None else 1)
    return LaunchConfig(max_nodes=hi, nproc_per_node=nproc, node_rank=node_rank, **common)


def config_from_local(env: Mapping[str, str]) -> LaunchConfig:
    """Local simulated nodes: NODES and NPROC (Makefile variables); the store endpoint is filled in at start."""
    nodes = int(env.get("NODES") or 2)
    nproc_raw = env.get("NPROC") or "1"
    common = _common(env, f"127.0.0.1:{DEFAULT_RDZV_PORT}", "t5-local")
    common["external_store"] = True  # local runs always use a standalone store (started by run_local)
    return LaunchConfig(max_nodes=nodes, nproc_per_node=int(nproc_raw) if nproc_raw.isdigit() else nproc_raw,
                        **common)


def config_from_env(kind: str, env: Mapping[str, str] | None = None) -> LaunchConfig:
    """``local`` | ``slurm`` | ``pet`` -> LaunchConfig (flags are applied on top by :func:`main`)."""
    env = os.environ if env is None else env
    if kind == "local":
        return config_from_local(env)
    if kind == "slurm":
        return config_from_slurm(env)
    if kind == "pet":
        return config_from_pet(env)
    raise LaunchError(f"--from-env {kind!r}: use local, slurm or pet")


# ------------------------------------------------------------------------------------------- pre-flight
def preflight(cfg: LaunchConfig) -> list[str]:
    """Validate the training arguments before any agent starts; returns warnings, raises LaunchError.

    torchrun retries a worker that exits 2 (bad config) ``--max-restarts`` times, start-up included, so a
    typo would cost minutes before failing. Only for the project's own training module.
    """
    if cfg.module != "training":
        return []
    from training.config import ConfigError, load_config  # no torch import: cheap
    try:
        tcfg = load_config(training_argv(cfg))
    except ConfigError as e:
        raise LaunchError(f"training arguments: {e}") from None
    except SystemExit:  # argparse already printed what is wrong
        raise LaunchError("training arguments rejected (see above); python -m training --help lists them") from None
    if not isinstance(cfg.nproc_per_node, int):
        return []
    gb = tcfg.train.global_batch
    worlds = [n * cfg.nproc_per_node for n in range(cfg.min_nodes, cfg.max_nodes + 1)]
    bad = [w for w in worlds if gb % w]
    if len(bad) == len(worlds):
        raise LaunchError(f"train.global_batch={gb} divides by none of the world sizes {worlds} this launch "
                          f"allows ({cfg.min_nodes}..{cfg.max_nodes} nodes x {cfg.nproc_per_node}); pick a multiple "
                          f"of {cfg.max_nodes * cfg.nproc_per_node}")
    if bad:
        return [f"train.global_batch={gb} does not divide by world sizes {bad}: if the job runs at one of "
                f"them the workers exit with a config error; raise --min-nodes or choose another global batch"]
    return []


# ------------------------------------------------------------------------------------------- local runner
def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def start_store(workdir: str, python: str = sys.executable, timeout_s: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start ``training.rdzv_store`` on a free port; returns (process, port) once it serves."""
    port_file = os.path.join(workdir, "rdzv_store.port")
    proc = subprocess.Popen(store_argv(0, port_file, python), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            raise LaunchError(f"rendezvous store exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LaunchError(f"rendezvous store did not start within {timeout_s:.0f} s")
        time.sleep(0.05)
    with open(port_file) as f:
        return proc, int(f.read())


def run_local(cfg: LaunchConfig, nodes: int, own_store_needed: bool = True) -> int:
    """Run ``nodes`` agents on this machine against a standalone store; returns the job's exit code.

    With ``own_store_needed`` a store is started on a free port (and stopped at the end); otherwise
    ``cfg.rdzv_endpoint`` must already serve one.
    """
    own_store = None
    workdir = tempfile.mkdtemp(prefix="t5-launch-")
    if own_store_needed:
        own_store, port = start_store(workdir, cfg.python)
        cfg = replace(cfg, rdzv_endpoint=f"127.0.0.1:{port}")
        print(f"[launch] rendezvous store pid {own_store.pid} on 127.0.0.1:{port}", flush=True)
    argv, env = torchrun_argv(cfg), launch_env(cfg)
    print(f"[launch] {nodes} node(s): {format_argv(argv, RDZV_ENV)}", flush=True)
    agents = []
    for i in range(nodes):
        # a new session per agent: a terminal's Ctrl-C reaches us once, and we forward it explicitly
        p = subprocess.Popen(argv, env=dict(env, T5_NODE_RANK=str(i)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=_pump, args=(p.stdout, f"[node{i}] "), daemon=True).start()
        agents.append(p)

    def forward(signum, _frame):
        print(f"[launch] got signal {signum}: forwarding to {nodes} agent(s)", flush=True)
        for p in agents:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    codes = [p.wait() for p in agents]
    if own_store is not None:
        own_store.terminate()
        own_store.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)
    for i, c in enumerate(codes):
        if c:
            print(f"[launch] node{i} exited with {c}" + (" (restarts exhausted or a worker failed for good; "
                  "checkpoints are kept, rerun to resume)" if c == 1 else ""), flush=True)
    bad = [c for c in codes if c]
    return bad[0] if bad else 0


# -------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="python -m training.launch", description=doc[0] + "\n\n" + doc[1],
                                epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-env", choices=["local", "slurm", "pet"], default="local",
                   help="where node count/rank/endpoint come from (default local: simulated nodes here)")
    p.add_argument("--nodes", type=int, help="MAX nodes (local: how many agents to start; default NODES or 2)")
    p.add_argument("--min-nodes", type=int, help="MIN nodes to keep training with (default 1 or T5_MIN_NODES)")
    p.add_argument("--nproc-per-node", help="workers per node (int|gpu|cpu|auto)")
    p.add_argument("--max-restarts", type=int, help="worker-group restarts before failing (default 3)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of a standalone store (implies is_host=false)")
    p.add_argument("--rdzv-id", help="rendezvous id (default derived from the platform)")
    p.add_argument("--node-hosts-store", action="store_true",
                   help="with --rdzv-endpoint: the agent on that host serves the store (plain c10d)")
    p.add_argument("--shutdown-timeout", type=int, help="seconds between SIGTERM and SIGKILL of workers (30)")
    p.add_argument("--train-timeout-s", type=int,
                   help="process-group timeout after step 1, for hang detection (default 30; 0 = training's)")
    p.add_argument("--join-timeout", type=int, metavar="SECONDS",
                   help="how long a rendezvous round waits for MIN nodes, e.g. a replacement node's boot "
                        "and image pull (default 120)")
    p.add_argument("--keep-alive", metavar="INTERVALxATTEMPTS",
                   help="rendezvous heartbeat, e.g. 1x3 (node-loss detection = product, default 1x3)")
    p.add_argument("--module", default="training", help="module the workers run (default training)")
    p.add_argument("--print", dest="print_only", action="store_true", help="print the command(s), run nothing")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the training module's arguments")
    return p


def config_from_args(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> LaunchConfig:
    """Platform mapping first, then explicit flags on top."""
    cfg = config_from_env(a.from_env, env)
    over: dict = {"module": a.module}
    if a.nodes is not None:
        over["max_nodes"] = a.nodes
    if a.min_nodes is not None:
        over["min_nodes"] = a.min_nodes
    if a.nproc_per_node is not None:
        over["nproc_per_node"] = int(a.nproc_per_node) if a.nproc_per_node.isdigit() else a.nproc_per_node
    if a.max_restarts is not None:
        over["max_restarts"] = a.max_restarts
    if a.rdzv_endpoint:
        over["rdzv_endpoint"] = a.rdzv_endpoint
        over["external_store"] = not a.node_hosts_store
    if a.rdzv_id:
        over["rdzv_id"] = a.rdzv_id
    if a.shutdown_timeout is not None:
        over["shutdown_timeout_s"] = a.shutdown_timeout
    if a.train_timeout_s is not None:
        over["train_timeout_s"] = a.train_timeout_s
    if a.join_timeout is not None:
        over["tuning"] = replace(cfg.tuning, join_timeout=a.join_timeout)
    if a.keep_alive:
        try:
            iv, att = (int(x) for x in a.keep_alive.lower().split("x"))
        except ValueError:
            raise LaunchError(f"--keep-alive {a.keep_alive!r}: expected INTERVALxATTEMPTS, e.g. 1x3") from None
        over["tuning"] = replace(over.get("tuning", cfg.tuning), keep_alive_interval=iv, keep_alive_max_attempt=att)
    targs = list(a.train_args)
    if targs and targs[0] == "--":
        targs = targs[1:]
    over["train_args"] = tuple(targs)
    cfg = replace(cfg, **over)
    if cfg.min_nodes > cfg.max_nodes:  # e.g. T5_MIN_NODES=2 with --nodes 1: say which values clash
        raise LaunchError(f"min nodes {cfg.min_nodes} > max nodes {cfg.max_nodes}: lower --min-nodes/T5_MIN_NODES")
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unknown launcher option(s) {' '.join(unknown)}: training arguments go after '--' "
                     f"(python -m training.launch [options] -- --preset debug ...)")
    try:
        cfg = config_from_args(a)
        for w in preflight(cfg):
            print(f"[launch] warning: {w}", file=sys.stderr)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.from_env == "local":
        nodes = cfg.max_nodes
        own_store = not (a.rdzv_endpoint or os.environ.get("T5_RDZV_ENDPOINT"))
        if a.print_only:
            if own_store:
                print("# standalone rendezvous store (no training node hosts it):")
                print(format_argv(store_argv(DEFAULT_RDZV_PORT, python=cfg.python)))
            print(f"# one agent per simulated node, {nodes} node(s):")
            for i in range(nodes):
                print(format_argv(torchrun_argv(cfg), dict(RDZV_ENV, T5_NODE_RANK=str(i))))
            return 0
        return run_local(cfg, nodes, own_store)
    argv_, env = torchrun_argv(cfg), launch_env(cfg)
    if a.print_only:
        print(format_argv(argv_, {k: env[k] for k in (*RDZV_ENV, "T5_NODE_RANK") if k in env}))
        return 0
    print(f"[launch] {format_argv(argv_, RDZV_ENV)}", flush=True)
    os.execvpe(argv_[0], argv_, env)  # the agent replaces us: signals from Slurm/kubelet reach it directly
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())

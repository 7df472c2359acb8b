"""Scale simulation of the c10d rendezvous against the standalone store: first round and re-forming after a node loss.

Each simulated agent is a real torch ``DynamicRendezvousHandler`` (c10d backend, ``is_host=false``) built from
the launcher's own torchrun command line (:func:`training.launch.commands.torchrun_argv`, parsed by torchrun),
with the agent's patches applied (:func:`training.launch.rdzv_poll.apply_rdzv_poll`,
:func:`training.launch.spare_fixes.apply_spare_fixes`, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), against one
real ``python -m training.rdzv_store`` process. Agents are threads of this process, or with ``--procs P`` threads
of P worker processes (N/P each, each process with its own GIL; the coordinator gets each agent's round times
and store-call counts over a pipe and sends "go", "die" and "done" back); no worker and no training runs.

Per node count N (``--nodes MIN:MAX`` of the job = ``N-1:N``), one run:

1. all N agents call ``next_rendezvous()`` at once, then assign worker ranks as torchrun's agent does
   (``SimpleElasticAgent._assign_worker_ranks``); *first round* = from that start until the last agent has its
   rank. Then each agent polls ``num_nodes_waiting()`` every 0.1 s, as torchrun's monitor loop does while its
   workers are healthy.
2. the agent with group rank 0 "dies": it stops its keep-alive and calls nothing more (a SIGKILLed node). The
   survivors start their next rendezvous at once (their workers' collectives fail at once when a peer's
   processes die). *dropped* = from the kill until the store's state no longer lists the dead node (it expires
   after keep_alive_interval x keep_alive_max_attempt without a heartbeat); *re-formed* = from the kill until
   the last survivor has its rank in the N-1 round (MIN reached: the round closes after last_call_timeout).

Also measured: rendezvous store operations (state reads and compare-and-sets by the handlers) per second, how
many of the compare-and-sets lost the race, the size of the pickled rendezvous state, the latency of a ``get``
timed by a separate probe process every 20 ms, the lag of the agents' own threads (a 10 ms sleep that
overshoots means the simulation, not the store, was slow: the GIL and the shared cores), CPU use during the
first round (the whole machine, the store process, the agents' processes), and the first round's bound from
store round trips alone (3N serial round trips at the rate one client measured before the agents started).

Usage::

    python -m chaos.rdzv_scale --nodes 8,32,128        # one run per N, then a table
    python -m chaos.rdzv_scale --nodes 4 --json out.json
    python -m chaos.rdzv_scale --nodes 8,32,64,128 --procs 8   # agents over 8 processes

What it cannot show: network latency and bandwidth between nodes and the store (all loopback here), agent start
skew across real nodes (all agents start together: the worst burst), the store's behaviour on a loaded head node,
worker start and process-group set-up after the rendezvous, and anything the machine's CPU hides: 128 agents on
two cores, even in several processes, each take hundreds of ms between reading the state and writing it
(see the lag and CPU columns), where a real node takes a network round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from training.launch.commands import rdzv_conf, store_argv, torchrun_argv
from training.launch.config import RDZV_ENV, LaunchConfig, RdzvTuning
from training.launch.rdzv_poll import poll_s

MONITOR_INTERVAL_S = 0.1  # torchrun's --monitor-interval default: how often a healthy agent checks for waiters
PROBE_INTERVAL_S = 0.02
NAN = float("nan")


@dataclass
class ScaleResult:
    """One simulated run at ``nodes`` agents (times in seconds)."""

    nodes: int
    poll_s: float
    procs: int = 1
    agent_processes: int = 0  # distinct process ids among the round-1 node descriptors
    first_round_s: float = NAN
    reform_dropped_s: float = NAN
    reform_s: float = NAN
    reformed_world: int = -1
    reformed_ranks: list[int] = dataclasses.field(default_factory=list)
    victim_in_new_round: bool = True
    state_kb: float = NAN
    store_ops_per_s_first: float = NAN
    store_ops_per_s_steady: float = NAN
    store_ops_per_s_reform: float = NAN
    probe_ms_p50: float = NAN
    probe_ms_max: float = NAN
    lag_ms_max: float = NAN
    cas_per_s_first: float = NAN
    cas_lost_pct_first: float = NAN
    cpu_machine_pct_first: float = NAN
    cpu_store_pct_first: float = NAN
    cpu_agents_pct_first: float = NAN
    store_rt_per_s: float = NAN
    store_bound_first_s: float = NAN
    error: str = ""

    @property
    def store_bound_first_ms(self) -> float:
        return 1000 * self.store_bound_first_s

    @property
    def ok(self) -> bool:
        return (self.reformed_world == self.nodes - 1 and self.reformed_ranks == list(range(self.nodes - 1))
                and not self.victim_in_new_round)


class _Counters:
    """Store traffic of the handlers in one process: every store call, and the compare-and-sets among them."""

    def __init__(self) -> None:
        self.ops = self.cas = self.cas_lost = 0
        self._lock = threading.Lock()

    def add(self, ops: int = 0, cas: int = 0, lost: int = 0) -> None:
        with self._lock:
            self.ops += ops
            self.cas += cas
            self.cas_lost += lost

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.ops, self.cas, self.cas_lost


def rendezvous_parameters(cfg: LaunchConfig):
    """torch's RendezvousParameters for ``cfg``, built the way torchrun's ``launch_agent`` builds them from the
    launcher's command line (so the simulation uses the cluster's --rdzv-conf)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.run import config_from_args, parse_args

    tconf, _, _ = config_from_args(parse_args(torchrun_argv(cfg)[3:]))  # after "python -m training.launch.agent"
    return RendezvousParameters(backend=tconf.rdzv_backend, endpoint=tconf.rdzv_endpoint, run_id=tconf.run_id,
                                min_nodes=tconf.min_nodes, max_nodes=tconf.max_nodes, local_addr=tconf.local_addr,
                                **tconf.rdzv_configs)


@contextlib.contextmanager
def agent_patches(max_nodes: int):
    """What :mod:`training.launch.agent` applies before torchrun's agent runs, for the duration of the block
    (torch's functions and the environment are put back after it: an agent process never needs that, a test
    process does). Yields the poll interval."""
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    from training.launch.rdzv_poll import apply_rdzv_poll
    from training.launch.spare_fixes import apply_spare_fixes

    saved = [(dr, "_delay"), (dr._BackendRendezvousStateHolder, "__init__"), (dr._RendezvousJoinOp, "__call__"),
             (api.SimpleElasticAgent, "run"), (dr.DynamicRendezvousHandler, "num_nodes_waiting")]
    saved = [(obj, name, obj.__dict__[name]) for obj, name in saved]
    env = {k: os.environ.get(k) for k in RDZV_ENV}
    os.environ.update(RDZV_ENV)
    try:
        apply_spare_fixes()
        yield apply_rdzv_poll(max_nodes)
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SimAgent(threading.Thread):
    """One simulated node: a real DynamicRendezvousHandler driven like torchrun's agent drives it."""

    def __init__(self, idx: int, params, start: threading.Barrier, go: threading.Event, counts: _Counters) -> None:
        super().__init__(name=f"sim-agent-{idx}", daemon=True)
        self.idx, self.params, self.start_barrier, self.counts = idx, params, start, counts
        self.go = go                      # set by the driver to start round 1
        self.failed = threading.Event()   # survivors: "my workers failed" -> next rendezvous
        self.die = threading.Event()      # the victim: stop everything, as SIGKILL would
        self.done = threading.Event()     # driver: the run is over, leave
        self.handler = None
        self.rounds: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def _count_store_ops(self) -> None:
        backend = self.handler._state_holder._backend
        call, set_state = backend._call_store, backend.set_state

        def counted(*a, **kw):
            self.counts.add(ops=1)
            return call(*a, **kw)

        def counted_set(*a, **kw):
            # set_state is torch's compare-and-set of the whole state; its third result says whether it won
            result = set_state(*a, **kw)
            self.counts.add(cas=1, lost=int(result is not None and not result[2]))
            return result

        backend._call_store, backend.set_state = counted, counted_set

    def _round(self) -> None:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

        t0 = time.monotonic()
        info = self.handler.next_rendezvous()
        spec = WorkerSpec(role="default", local_world_size=1, rdzv_handler=self.handler, entrypoint="sim")
        # torchrun's own rank assignment (rank 0 gathers every agent's role info from the store); it uses no
        # agent state, so it runs unbound here
        workers = SimpleElasticAgent._assign_worker_ranks(None, info.store, info.rank, info.world_size, spec)
        node = self.handler._this_node
        self.rounds.append({"start": t0, "ranked": time.monotonic(), "rank": info.rank, "world": info.world_size,
                            "global_rank": workers[0].global_rank, "round": self.handler._state_holder.state.round,
                            "node": [node.addr, node.pid, node.local_id]})

    def run(self) -> None:
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        try:
            self.handler = get_rendezvous_handler(self.params)  # as torchrun's launch_agent gets it
            self._count_store_ops()
            self.start_barrier.wait()
            self.go.wait()
            self._round()
            while not (self.failed.is_set() or self.die.is_set() or self.done.is_set()):
                time.sleep(MONITOR_INTERVAL_S)
                if not self.die.is_set():
                    self.handler.num_nodes_waiting()
            if self.die.is_set():
                self.handler._stop_heartbeats()  # a dead node's keep-alive stops; it leaves nothing behind
                return
            if self.failed.is_set():
                self._round()
                self.done.wait()
            self.handler.shutdown()
        except BaseException as e:  # noqa: BLE001 - reported by the driver
            self.error = e
            self.start_barrier.abort()


class _AgentHost:
    """The simulated agents ``indices`` living in this process, and the events that drive them."""

    def __init__(self, params, indices: range) -> None:
        self.counts = _Counters()
        self.barrier, self.go = threading.Barrier(len(indices) + 1), threading.Event()
        self.agents = {i: SimAgent(i, params, self.barrier, self.go, self.counts) for i in indices}

    def start(self, timeout_s: float) -> None:
        for a in self.agents.values():
            a.start()
        self.barrier.wait(timeout=timeout_s)  # every handler connected: only the rendezvous is timed

    def kill(self, victim: int) -> None:
        """``victim`` dies; every other agent here starts its next rendezvous (its workers failed)."""
        if victim in self.agents:
            self.agents[victim].die.set()
        for i, a in self.agents.items():
            if i != victim:
                a.failed.set()

    def finish(self) -> None:
        for a in self.agents.values():
            a.done.set()

    def errors(self) -> list[str]:
        return [f"agent {a.idx}: {a.error!r}" for a in self.agents.values() if a.error is not None]


class _ThreadPool:
    """Thread mode: every agent is a thread of this process (one GIL for all of them)."""

    def __init__(self, params, nodes: int, timeout_s: float) -> None:
        self.host = _AgentHost(params, range(nodes))
        self.host.start(timeout_s)
        self.pids = [os.getpid()]
        self._lag: list[float] = []
        self._stop_lag = threading.Event()
        threading.Thread(target=_lag_monitor, args=(self._stop_lag, self._lag), daemon=True).start()

    def go(self) -> None:
        self.host.go.set()

    def rounds(self, i: int) -> list[dict[str, Any]]:
        return self.host.agents[i].rounds

    def errors(self) -> list[str]:
        return self.host.errors()

    def counts(self) -> tuple[int, int, int]:
        return self.host.counts.snapshot()

    def lag_max_s(self) -> float:
        return max(self._lag, default=0.0)

    def kill(self, victim: int) -> None:
        self.host.kill(victim)

    def finish(self, store_alive_s: float) -> None:
        self.host.finish()
        _join_all(list(self.host.agents.values()), store_alive_s)  # survivors shut down while the store is up

    def close(self) -> None:
        self._stop_lag.set()
        _join_all(list(self.host.agents.values()), 10)  # threads stuck in a failed round end once the store is gone


class _ProcPool:
    """Process mode: the agents are spread over ``procs`` worker processes (``--worker``), each running its share
    as threads with the agent's patches and its own GIL. Each worker reports its agents' rounds (monotonic
    clock times, shared by all processes of the machine), store-call counts and thread lag as JSON lines on its
    stdout; this process sends it ``go``, ``die IDX`` and ``done`` on its stdin."""

    def __init__(self, spec: dict[str, Any], nodes: int, procs: int, workdir: str, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[int, list[dict[str, Any]]] = {i: [] for i in range(nodes)}
        self._errors: list[str] = []
        self._counts: dict[int, tuple[int, int, int]] = {}
        self._lag: dict[int, float] = {}
        self._ready: set[int] = set()
        self.procs: list[subprocess.Popen] = []
        self._stderr: list[str] = []
        bounds = [nodes * k // procs for k in range(procs + 1)]
        for k in range(procs):
            err = os.path.join(workdir, f"worker-{k}.err")
            self._stderr.append(err)
            argv = [sys.executable, "-m", "chaos.rdzv_scale", "--worker",
                    json.dumps(spec | {"first": bounds[k], "stop": bounds[k + 1]})]
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(err, "w"),
                                 text=True, bufsize=1)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(k, p), daemon=True).start()
        self.pids = [p.pid for p in self.procs]
        deadline = time.monotonic() + timeout_s
        while len(self._ready) < procs:
            if self._errors:
                raise RuntimeError(f"a worker failed before the rendezvous: {self._errors[0]}")
            for k, p in enumerate(self.procs):
                if p.poll() is not None and k not in self._ready:
                    raise RuntimeError(f"worker {k} exited with {p.returncode} before its handlers connected: "
                                       f"{self._tail(k)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{procs} workers did not connect their handlers within {timeout_s:.0f} s")
            time.sleep(0.01)

    def _tail(self, k: int) -> str:
        with open(self._stderr[k]) as f:
            return f.read()[-1500:]

    def _read(self, k: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            msg = json.loads(line)
            with self._lock:
                if msg.get("ready"):
                    self._ready.add(k)
                for i, rs in msg.get("rounds", {}).items():
                    self._rounds[int(i)].extend(rs)
                self._errors.extend(msg.get("errors", []))
                if "counts" in msg:
                    self._counts[k] = tuple(msg["counts"])
                    self._lag[k] = msg["lag"]

    def _send(self, line: str) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    p.stdin.write(line + "\n")
                    p.stdin.flush()

    def go(self) -> None:
        self._send("go")

    def rounds(self, i: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rounds[i])

    def errors(self) -> list[str]:
        with self._lock:
            errs = list(self._errors)
        dead = [f"worker {k} exited with {p.returncode}: {self._tail(k)}" for k, p in enumerate(self.procs)
                if p.poll() not in (None, 0)]
        return errs + dead

    def counts(self) -> tuple[int, int, int]:
        with self._lock:
            c = list(self._counts.values())
        return tuple(sum(x[j] for x in c) for j in range(3)) if c else (0, 0, 0)  # type: ignore[return-value]

    def lag_max_s(self) -> float:
        with self._lock:
            return max(self._lag.values(), default=0.0)

    def kill(self, victim: int) -> None:
        self._send(f"die {victim}")

    def finish(self, store_alive_s: float) -> None:
        self._send("done")
        deadline = time.monotonic() + store_alive_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def _worker(spec_json: str) -> int:
    """A worker process of the process mode: agents ``first..stop-1`` as threads; see :class:`_ProcPool`."""
    import logging

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    spec = json.loads(spec_json)
    cfg = LaunchConfig(min_nodes=spec["nodes"] - 1, max_nodes=spec["nodes"], rdzv_endpoint=spec["endpoint"],
                       rdzv_id=spec["run_id"], external_store=True, tuning=RdzvTuning(**spec["tuning"]))
    out = sys.stdout
    sys.stdout = sys.stderr  # stdout carries the reports alone

    def emit(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    with agent_patches(spec["nodes"]):
        host = _AgentHost(rendezvous_parameters(cfg), range(spec["first"], spec["stop"]))
        try:
            host.start(spec["timeout_s"])
        except threading.BrokenBarrierError:
            emit({"errors": host.errors() or ["a handler did not connect"]})
            return 1
        lag: list[float] = []
        stop = threading.Event()
        threading.Thread(target=_lag_monitor, args=(stop, lag), daemon=True).start()
        emit({"ready": True})

        def commands() -> None:
            for line in sys.stdin:
                cmd, *arg = line.split()
                if cmd == "go":
                    host.go.set()
                elif cmd == "die":
                    host.kill(int(arg[0]))
                elif cmd == "done":
                    break
            host.finish()  # "done", or the coordinator is gone (stdin closed)
            stop.set()

        threading.Thread(target=commands, daemon=True).start()
        sent = {i: 0 for i in host.agents}
        reported: set[str] = set()

        def report() -> None:
            new = {}
            for i, a in host.agents.items():
                rs = a.rounds[sent[i]:]
                if rs:
                    new[str(i)] = rs
                    sent[i] += len(rs)
            errs = [e for e in host.errors() if e not in reported]
            reported.update(errs)
            emit({"rounds": new, "errors": errs, "counts": host.counts.snapshot(), "lag": max(lag, default=0.0)})

        while not stop.wait(0.02):
            report()
        _join_all(list(host.agents.values()), 5)  # survivors shut their handlers down
        report()
    return 0


def _state(store, run_id: str):
    """The rendezvous state object as the agents see it (our own store: unpickling it is safe here)."""
    from base64 import b64decode

    raw = store.get(f"torch.rendezvous.{run_id}")
    if raw == b"Y2FuaW1hZGFt":  # C10dRendezvousBackend's "no state yet" sentinel
        return None, 0
    bits = b64decode(raw)
    return pickle.loads(bits), len(bits)


def _lag_monitor(stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        t = time.monotonic()
        time.sleep(0.01)
        out.append(time.monotonic() - t - 0.01)


def _start_probe(endpoint: str, out_file: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chaos.rdzv_scale", "--probe", endpoint, "--probe-out", out_file],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _probe(endpoint: str, out_file: str) -> int:
    """A separate client process: time a ``get`` every PROBE_INTERVAL_S until SIGTERM (wall time, seconds)."""
    import signal

    import torch.distributed as dist

    host, _, port = endpoint.rpartition(":")
    client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
    client.set("t5f/probe", "x")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(out_file, "w") as f:
        while not stop.is_set():
            t = time.time()
            client.get("t5f/probe")
            f.write(f"{t:.4f} {time.time() - t:.6f}\n")
            f.flush()
            time.sleep(PROBE_INTERVAL_S)
    return 0


def _store_round_trips_per_s(store, nodes: int, n: int = 200) -> float:
    """Serial store round trips per second (a ``get`` then a ``compare_set`` of a value the size of the base64
    rendezvous state at ``nodes`` nodes), from one client while nothing else uses the store."""
    value = "x" * (100 * nodes)  # ~75 B per node pickled (9.5 KiB at 128), x4/3 for base64
    store.set("t5f/bench", value)
    t = time.monotonic()
    for _ in range(n):
        store.get("t5f/bench")
        store.compare_set("t5f/bench", value, value)
    return 2 * n / (time.monotonic() - t)


def store_bound_ops(nodes: int) -> int:
    """Store round trips the first round needs at the least: each node reads the state and wins one compare-and-set
    (N writes in turn, as one key holds the state), then reads the closed round once."""
    return 3 * nodes


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far, threads included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, sum(v)


class _CpuWindow:
    """CPU use between two points: the whole machine (percent of all its cores), and given processes (percent of
    one core)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.t, self.m = time.monotonic(), _machine_cpu()
        self.c = {k: sum(_cpu_s(p) for p in ps) for k, ps in pids.items()}

    def end(self) -> dict[str, float]:
        dt, m = time.monotonic() - self.t, _machine_cpu()
        out = {"machine": 100 * (m[0] - self.m[0]) / max(1, m[1] - self.m[1])}
        for k, ps in self.pids.items():
            with contextlib.suppress(OSError):
                out[k] = 100 * (sum(_cpu_s(p) for p in ps) - self.c[k]) / dt
        return out


def _wait_until(cond, timeout_s: float, what: str, pool) -> float:
    deadline = time.monotonic() + timeout_s
    while not cond():
        errors = pool.errors()
        if errors:
            raise RuntimeError(f"a simulated agent failed while waiting for {what}: {errors[0]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.005)
    return time.monotonic()


def simulate(nodes: int, *, procs: int = 1, tuning: RdzvTuning = RdzvTuning(), steady_s: float = 2.0,
             timeout_s: float = 120.0, probe: bool = True, say=print) -> ScaleResult:
    """Run the two rounds at ``nodes`` agents against a fresh store process; see the module docstring.
    ``procs`` 1: the agents are threads of this process; more: they are spread over that many worker processes."""
    if nodes < 2:
        raise ValueError(f"--nodes {nodes}: need at least 2 (one dies, MIN = N-1 re-form)")
    if not 1 <= procs <= nodes:
        raise ValueError(f"--procs {procs}: need 1 (agents as threads of this process) up to N={nodes} processes")
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    from training.launch.local import start_store

    patches = agent_patches(nodes) if procs == 1 else contextlib.nullcontext(poll_s(nodes))
    poll = patches.__enter__()  # left in the finally below, once no simulated agent runs here
    workdir = tempfile.mkdtemp(prefix="t5-rdzv-scale-")
    store_proc, port = start_store(workdir, die_with_us=True)
    endpoint = f"127.0.0.1:{port}"
    run_id = f"scale-{nodes}-{os.getpid()}"
    cfg = LaunchConfig(min_nodes=nodes - 1, max_nodes=nodes, rdzv_endpoint=endpoint, rdzv_id=run_id,
                       external_store=True, tuning=tuning)
    probe_file = os.path.join(workdir, "probe.txt")
    probe_proc = None
    pool = None
    base = ScaleResult(nodes=nodes, procs=procs, poll_s=poll)
    try:
        observer = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        rate = _store_round_trips_per_s(observer, nodes)
        base = replace(base, store_rt_per_s=rate, store_bound_first_s=store_bound_ops(nodes) / rate)
        probe_proc = _start_probe(endpoint, probe_file) if probe else None
        if procs == 1:
            pool = _ThreadPool(rendezvous_parameters(cfg), nodes, timeout_s)
        else:
            spec = {"nodes": nodes, "endpoint": endpoint, "run_id": run_id, "tuning": dataclasses.asdict(tuning),
                    "timeout_s": timeout_s}
            pool = _ProcPool(spec, nodes, procs, workdir, timeout_s)
        where = "threads of this process" if procs == 1 else f"threads of {procs} processes"
        say(f"[rdzv-scale] N={nodes}: {nodes} handlers ({where}) connected to {endpoint} ({rdzv_conf(cfg)}, "
            f"poll {poll:g} s)")

        (ops0, cas0, lost0), t_go, w_go = pool.counts(), time.monotonic(), time.time()
        cpu = _CpuWindow({"store": [store_proc.pid], "agents": pool.pids})
        seen: list[tuple[int, int]] = []  # (participants, heartbeats) in the state, every 0.5 s of round 1

        def first_done() -> bool:
            if all(pool.rounds(i) for i in range(nodes)):
                return True
            if time.monotonic() - t_go > 0.5 * (len(seen) + 1):
                st, _ = _state(observer, run_id)
                seen.append((len(st.participants), len(st.last_heartbeats)) if st is not None else (0, 0))
            return False

        pool.go()
        try:
            t_first = _wait_until(first_done, timeout_s, "the first round", pool)
        except (RuntimeError, TimeoutError) as e:
            done = sum(1 for i in range(nodes) if pool.rounds(i))
            tail = ", ".join(f"{p}/{h}" for p, h in seen[-6:])
            e = f"{e}; joined/heartbeating nodes in the state: at most {max(p for p, _ in seen)}, last 3 s: {tail}" \
                if seen else e
            dt, (ops, cas, lost), use = time.monotonic() - t_go, pool.counts(), cpu.end()
            return replace(base, lag_ms_max=1000 * pool.lag_max_s(), store_ops_per_s_first=(ops - ops0) / dt,
                           cas_per_s_first=(cas - cas0) / dt, cas_lost_pct_first=100 * (lost - lost0) / max(1, cas - cas0),
                           cpu_machine_pct_first=use["machine"], cpu_store_pct_first=use.get("store", NAN),
                           cpu_agents_pct_first=use.get("agents", NAN),
                           error=f"first round: {done}/{nodes} agents ranked after {dt:.0f} s; {e}")
        use = cpu.end()
        first_s, (ops, cas, lost) = t_first - t_go, pool.counts()
        base = replace(base, first_round_s=first_s, store_ops_per_s_first=(ops - ops0) / first_s,
                       cas_per_s_first=(cas - cas0) / first_s, cas_lost_pct_first=100 * (lost - lost0) / max(1, cas - cas0),
                       cpu_machine_pct_first=use["machine"], cpu_store_pct_first=use.get("store", NAN),
                       cpu_agents_pct_first=use.get("agents", NAN))
        state, state_bytes = _state(observer, run_id)
        base = replace(base, agent_processes=len({pool.rounds(i)[0]["node"][1] for i in range(nodes)}))
        say(f"[rdzv-scale] N={nodes}: first round {first_s:.2f} s, {len(state.participants)} participants")

        ops1 = pool.counts()[0]
        time.sleep(steady_s)  # healthy agents polling num_nodes_waiting
        ops_steady = (pool.counts()[0] - ops1) / steady_s

        victim = next(i for i in range(nodes) if pool.rounds(i)[0]["rank"] == 0)
        dead_node = _NodeDesc(*pool.rounds(victim)[0]["node"])
        ops2, t_kill = pool.counts()[0], time.monotonic()
        pool.kill(victim)
        survivors = [i for i in range(nodes) if i != victim]
        base = replace(base, state_kb=state_bytes / 1024, store_ops_per_s_steady=ops_steady)

        def dropped() -> bool:
            st, _ = _state(observer, run_id)
            return st is not None and dead_node not in st.participants and dead_node not in st.last_heartbeats

        try:
            t_dropped = _wait_until(dropped, timeout_s, "the dead node's removal", pool)
            t_reformed = _wait_until(lambda: all(len(pool.rounds(i)) == 2 for i in survivors), timeout_s,
                                     "the re-formed round", pool)
        except (RuntimeError, TimeoutError) as e:
            return replace(base, lag_ms_max=1000 * pool.lag_max_s(), error=f"re-forming: {e}")
        ops_reform = (pool.counts()[0] - ops2) / (t_reformed - t_kill)
        new_state, new_bytes = _state(observer, run_id)
        ranks = sorted(pool.rounds(i)[1]["global_rank"] for i in survivors)
        worlds = {pool.rounds(i)[1]["world"] for i in survivors}
        w_end = time.time()
        lag_ms = 1000 * pool.lag_max_s()
        pool.finish(5)
        say(f"[rdzv-scale] N={nodes}: dead node dropped after {t_dropped - t_kill:.2f} s, re-formed with "
            f"{len(new_state.participants)} after {t_reformed - t_kill:.2f} s")
        lat = _read_probe(probe_file, probe_proc, w_go, w_end) if probe_proc else []
        return replace(
            base, reform_dropped_s=t_dropped - t_kill,
            reform_s=t_reformed - t_kill, reformed_world=worlds.pop() if len(worlds) == 1 else -1,
            reformed_ranks=ranks, victim_in_new_round=dead_node in new_state.participants,
            state_kb=max(state_bytes, new_bytes) / 1024, store_ops_per_s_reform=ops_reform,
            probe_ms_p50=1000 * statistics.median(lat) if lat else NAN,
            probe_ms_max=1000 * max(lat) if lat else NAN, lag_ms_max=lag_ms)
    finally:
        if pool is not None:
            pool.finish(5)  # survivors shut their handlers down (the store must still be there)
        if probe_proc is not None and probe_proc.poll() is None:
            probe_proc.terminate()
            probe_proc.wait(timeout=30)
        store_proc.terminate()
        store_proc.wait(timeout=30)
        if pool is not None:
            pool.close()
        patches.__exit__(None, None, None)  # only now: no simulated agent calls torch's functions any more


def _join_all(threads: list[threading.Thread], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def _read_probe(path: str, proc: subprocess.Popen, w_from: float, w_to: float) -> list[float]:
    """Probe latencies (s) timed between wall times ``w_from`` and ``w_to`` (the two rounds and the steady part)."""
    proc.terminate()
    proc.wait(timeout=30)
    out = []
    with open(path) as f:
        for line in f:
            t, dt = (float(x) for x in line.split())
            if w_from <= t <= w_to:
                out.append(dt)
    return out


COLUMNS = [("N", "nodes", "{:d}"), ("procs", "procs", "{:d}"), ("poll s", "poll_s", "{:.2f}"), ("first round s", "first_round_s", "{:.2f}"),
           ("dead dropped s", "reform_dropped_s", "{:.2f}"), ("re-formed s", "reform_s", "{:.2f}"),
           ("state KiB", "state_kb", "{:.1f}"), ("ops/s 1st", "store_ops_per_s_first", "{:.0f}"),
           ("ops/s steady", "store_ops_per_s_steady", "{:.0f}"), ("ops/s re-form", "store_ops_per_s_reform", "{:.0f}"),
           ("get p50 ms", "probe_ms_p50", "{:.2f}"), ("get max ms", "probe_ms_max", "{:.1f}"),
           ("sim lag max ms", "lag_ms_max", "{:.0f}"), ("CAS/s 1st", "cas_per_s_first", "{:.0f}"),
           ("CAS lost % 1st", "cas_lost_pct_first", "{:.0f}"), ("CPU % machine 1st", "cpu_machine_pct_first", "{:.0f}"),
           ("CPU % store 1st", "cpu_store_pct_first", "{:.0f}"), ("CPU % agents 1st", "cpu_agents_pct_first", "{:.0f}"),
           ("store RT/s", "store_rt_per_s", "{:.0f}"),
           ("store-bound 1st ms", "store_bound_first_ms", "{:.0f}"), ("N-1 ranks ok", "ok", "{}")]


def table(results: list[ScaleResult]) -> str:
    """A Markdown table, one row per node count."""
    head = "| " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---:" for _ in COLUMNS) + "|"
    def cell(r: ScaleResult, attr: str, fmt: str) -> str:
        v = getattr(r, attr)
        return "-" if isinstance(v, float) and v != v else fmt.format(v)

    rows = ["| " + " | ".join(cell(r, attr, fmt) for _, attr, fmt in COLUMNS) + " |" for r in results]
    notes = [f"N={r.nodes}: {r.error}" for r in results if r.error]
    return "\n".join([head, rule, *rows, *([""] + notes if notes else [])])


def _nodes(raw: str) -> list[int]:
    try:
        ns = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes {raw!r}: expected comma-separated integers, e.g. 8,32,128") from None
    if not ns or min(ns) < 2:
        raise argparse.ArgumentTypeError(f"--nodes {raw!r}: each count must be >= 2 (one node dies)")
    return ns


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="python -m chaos.rdzv_scale", description=doc[0],
                                epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_nodes, default=[8, 32, 128], help="simulated agent counts (default 8,32,128)")
    p.add_argument("--procs", type=int, default=1,
                   help="spread the agents over this many worker processes, each with its own GIL (default 1: "
                        "all agents are threads of this process)")
    p.add_argument("--steady-s", type=float, default=2.0,
                   help="seconds of healthy polling between the rounds (measures steady store load; default 2)")
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up on a round after this (default 180)")
    p.add_argument("--no-probe", action="store_true", help="do not time store gets from a separate process")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--probe", help=argparse.SUPPRESS)  # internal: the probe process
    p.add_argument("--probe-out", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: a worker process of --procs
    a = p.parse_args(argv)
    if a.probe:
        return _probe(a.probe, a.probe_out)
    if a.worker:
        return _worker(a.worker)
    if a.procs < 1 or a.procs > min(a.nodes):
        p.error(f"--procs {a.procs}: expected 1 (threads of this process) up to the smallest --nodes "
                f"({min(a.nodes)}): each worker process runs at least one agent")
    import logging
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    t = RdzvTuning()
    print(f"[rdzv-scale] launcher tuning: last_call_timeout={t.last_call_timeout}s, keep-alive "
          f"{t.keep_alive_interval}s x {t.keep_alive_max_attempt}, poll = clamp(N/200, 0.1, 1.0) s: "
          + ", ".join(f"N={n}: {poll_s(n):g}" for n in a.nodes), flush=True)
    results = []
    for n in a.nodes:
        results.append(simulate(n, procs=a.procs, steady_s=a.steady_s, timeout_s=a.timeout_s, probe=not a.no_probe,
                                say=lambda m: print(m, flush=True)))
    print()
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"ok": r.ok} for r in results], f, indent=1, default=str)
    bad = [r.nodes for r in results if not r.ok]
    if bad:
        print(f"[rdzv-scale] FAIL at N={bad}: a round did not form, or the re-formed round is wrong (see the "
              f"table)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

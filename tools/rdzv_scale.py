"""Rendezvous at scale, simulated: the etcd handler and torch's c10d handler side by side, and the workers' store.

Each simulated agent is a real rendezvous handler driven as torchrun's agent drives it, with no worker and no
training: ``etcd``, the launcher's :class:`~training.launch.rendezvous.handler.EtcdRendezvousHandler` (lease
TTL 2 s, last call 3 s) against a real 3-member etcd (:class:`~training.launch.rendezvous.members.LocalEtcd`,
TLS and auth on, one job user); ``c10d`` and ``c10d-1x3``, torch's own ``DynamicRendezvousHandler`` (c10d
backend, ``is_host=false``, no launcher patch, torch's shared round TCPStore) against one real
``python -m training.rdzv_store``, with torch's default keep-alive (5 s x 3) or 1 s x 3 (the launcher's on c10d,
before etcd); last call 3 s for all. Agents are threads of this process, or with ``--procs P`` threads of P worker
processes (each with its own GIL, at a CPU priority 10 nice steps below the store's; the coordinator gets their
round times over a pipe and sends "go", "die" and "done").

Per handler and node count N (MIN:MAX = N-1:N), one run:

1. *connect*: all N handlers are built, 4 at a time per process (etcd: lease, member key, watches; the agents
   share the driver's login token (*login s* is one login; N at once: ``python -m tools.login_cost``); not part
   of the rounds.
2. *first round*: all N agents call ``next_rendezvous()`` at once, then torchrun's rank assignment
   (``SimpleElasticAgent._assign_worker_ranks``) in the launcher's environment (``TORCH_ELASTIC_WORKER_IDENTICAL``:
   from the round's rank, no gather through the round's store); from the start until the last agent has its
   rank. Then each agent is asked ``num_nodes_waiting()`` every 0.1 s (torchrun's monitor loop;
   one thread per process asks for all of its agents).
3. *steady*: ``--steady-s`` seconds of healthy agents: store operations and bytes per second (keep-alives).
4. *re-formed*: the agent with rank 0 (the round's store host; ``--victim closer``: the etcd closer) stops its
   keep-alive and calls nothing more (etcd: its lease thread and watches stop, nothing is revoked). etcd
   survivors go on asking ``num_nodes_waiting()`` and call ``next_rendezvous()`` when it says 1 (the lease
   expired and the closer opened the next round); torch's c10d says nothing about a lost node, so its
   survivors start at once (their workers' collectives fail when a peer dies). From the kill until the last
   survivor has its rank in the N-1 round.

For etcd a separate watch on the job's prefix (the driver's) times each phase: the last joined key, the
closer's close (the round record formed), the round's TCPStore named in it (since 2026-11-27 in the same
transaction that forms the round, so the two columns agree; before, rank 0 published it afterwards), and the last agent
with its rank (the round record's delivery to every agent, connecting to that store, rank assignment); for the
re-formed round also the lost member's key deleted (lease expiry) and the next round written (formed at once
when enough live members are left: no joins then, the column is empty). etcd operations
and bytes are the members' own counters (gRPC calls started and gRPC message bytes, all 3 members, from their
``/metrics``; the agents speak JSON over HTTPS, a few times larger on the wire, and renew their leases as
messages on one gRPC stream each, counted by message); c10d's are counted in the handlers (store calls, key and
value bytes). Beyond ~300 etcd agents, run it with ``T5_ETCD_BIN`` pointing at an etcd >= 3.4.20 / 3.5.5: the
tests' 3.5.1 serves at most 250 concurrent streams per TLS connection, which its gateway shares (it says so).

``--worker-ranks R`` (default 8) adds one row per N for the workers' store: N x R ranks, each with its own
client connection to one TCPStore in its own process (as rank 0's worker hosts it), each doing what
:class:`training.job.watchdog.PeerWatchdog` does once a second (set its counter, check and get its peer's).

CPU: the whole machine (percent of all cores), the store processes and the agents' processes (percent of one
core), and *sim lag* (how late a 10 ms sleep in an agent process wakes: when it is large the simulation, not
the store, is the limit).

Usage::

    python -m tools.rdzv_scale --nodes 16,64 --handlers etcd,c10d-1x3
    python -m tools.rdzv_scale --nodes 16,64,256,1024 --procs 8 --json bench/out/rdzv_scale.json

What a simulated agent does differently from a real node's (the handlers' calls and the store's side are
the real ones): it shares a process, its GIL and this machine's cores with the other agents (a real node has
its own); the agents of a process share one monitor thread (torchrun runs one loop per agent; each handler
keeps its own lease keep-alive thread and watches); the agents' processes run below the store's CPU priority
(a real store runs on hosts of its own), and switch threads every 50 ms instead of 5 ms (hundreds of threads
share one interpreter lock); the etcd agents share the driver's login token; there are no
workers (no torch process group, no training), and torch is imported once per process, not per agent.

What it cannot show: network latency and bandwidth between nodes and the store (all loopback here), agent
start skew across real nodes (all agents start together: the worst burst), the store on a loaded or remote
host, worker start and process-group set-up after the rendezvous, and anything this machine's CPU hides: N
agents share its cores, where each real node has its own (see the lag and CPU columns).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from tools import loopback_names
from training.launch.config import ETCD_MIN_LEASE_S, IDENTICAL_WORKERS_ENV, RdzvTuning

MONITOR_INTERVAL_S = 0.1  # torchrun's --monitor-interval default: how often a healthy agent checks for waiters
NAN = float("nan")
#: The handlers compared; c10d's keep-alive (interval s, attempts): torch's default and the launcher's before etcd.
HANDLERS = {"etcd": None, "c10d": (5, 3), "c10d-1x3": (1, 3)}
LAST_CALL_S = 3
#: The launcher's lease TTL (its keep-alive's interval x attempts, RdzvTuning; --etcd-ttl-s changes it).
ETCD_TTL_S = RdzvTuning().keep_alive_interval * RdzvTuning().keep_alive_max_attempt
#: Handlers built at once per process. Building is not timed; all N at once on 2 cores takes an etcd handler
#: longer than its lease between its grant and its member key's read-back, and past 256 agents even 4 at a time
#: per process overloaded the store (requests timed out, clients reconnected: thousands of TLS handshakes).
_BUILDING = threading.BoundedSemaphore(1)


@dataclass
class ScaleResult:
    """One simulated run of ``handler`` at ``nodes`` agents (times in seconds)."""

    handler: str
    nodes: int
    procs: int = 1
    lease_s: float = NAN
    connect_s: float = NAN
    login_s: float = NAN
    first_round_s: float = NAN
    lost_seen_s: float = NAN
    reform_s: float = NAN
    reformed_world: int = -1
    reformed_ranks: list[int] = dataclasses.field(default_factory=list)
    victim_in_new_round: bool = True
    victim_was_closer: bool | None = None
    ops_per_s_first: float = NAN
    ops_per_s_steady: float = NAN
    kib_per_s_steady: float = NAN
    ops_per_s_reform: float = NAN
    cas_lost_pct_first: float = NAN
    lag_ms_max: float = NAN
    cpu_machine_pct_first: float = NAN
    cpu_store_pct_first: float = NAN
    cpu_agents_pct_first: float = NAN
    cpu_store_pct_steady: float = NAN
    cpu_agents_pct_steady: float = NAN
    phases_first: dict[str, float] = dataclasses.field(default_factory=dict)
    phases_reform: dict[str, float] = dataclasses.field(default_factory=dict)
    rejoined: int = 0  # etcd survivors in the re-formed round under a new member id: their own lease had expired
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.reformed_world == self.nodes - 1
            and self.reformed_ranks == list(range(self.nodes - 1))
            and not self.victim_in_new_round
        )


@dataclass
class WorkerStoreResult:
    """The workers' heartbeat load on one TCPStore: ``ranks`` clients for ``seconds``."""

    nodes: int
    ranks: int
    target_ops_per_s: float = NAN
    ops_per_s: float = NAN
    kib_per_s: float = NAN
    op_ms_p50: float = NAN
    op_ms_max: float = NAN
    lap_s_max: float = NAN
    cpu_machine_pct: float = NAN
    cpu_store_pct: float = NAN
    cpu_clients_pct: float = NAN
    error: str = ""


# ---------------------------------------------------------------------------------------------- agents
class _Counters:
    """c10d store traffic of the handlers in one process: calls, payload bytes, compare-and-sets (and lost)."""

    def __init__(self) -> None:
        self.v = [0, 0, 0, 0]
        self._lock = threading.Lock()

    def add(self, *d: int) -> None:
        with self._lock:
            for i, x in enumerate(d):
                self.v[i] += x

    def snapshot(self) -> list[int]:
        with self._lock:
            return list(self.v)


def _payload(x: Any) -> int:
    if isinstance(x, (bytes, str)):
        return len(x)
    if isinstance(x, (list, tuple)):
        return sum(_payload(y) for y in x)
    return 0


def _build_handler(spec: dict[str, Any]):
    """A real rendezvous handler for ``spec`` (JSON-able: it also travels to worker processes)."""
    if spec["handler"] == "etcd":
        from training.launch.rendezvous.client import ClientCredentials, EtcdClient
        from training.launch.rendezvous.handler import EtcdRendezvousHandler

        client = EtcdClient(ClientCredentials.from_env(spec["creds"]))
        # the driver's login token: N agents logging in at once is a start-up cost, not a round's (measured apart:
        # python -m tools.login_cost)
        client._token = spec["token"]
        return EtcdRendezvousHandler(
            spec["run_id"],
            client,
            min_nodes=spec["nodes"] - 1,
            max_nodes=spec["nodes"],
            ttl_s=spec["etcd_ttl_s"],
            last_call_s=LAST_CALL_S,
            join_timeout_s=spec["timeout_s"],
            local_addr="127.0.0.1",
        )
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    interval, attempts = HANDLERS[spec["handler"]]
    t = RdzvTuning(
        last_call_timeout=LAST_CALL_S,
        join_timeout=int(spec["timeout_s"]),
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )
    params = RendezvousParameters(
        backend="c10d",
        endpoint=spec["endpoint"],
        run_id=spec["run_id"],
        min_nodes=spec["nodes"] - 1,
        max_nodes=spec["nodes"],
        local_addr="127.0.0.1",
        is_host=False,
        **{k: v for k, v in dataclasses.asdict(t).items()},
    )
    return get_rendezvous_handler(params)  # as torchrun's launch_agent gets it


class SimAgent(threading.Thread):
    """One simulated node: a real rendezvous handler driven like torchrun's agent drives it."""

    def __init__(
        self, idx: int, spec: dict[str, Any], start: threading.Barrier, go: threading.Event, counts: _Counters
    ) -> None:
        super().__init__(name=f"sim-agent-{idx}", daemon=True)
        self.idx, self.spec, self.start_barrier, self.counts = idx, spec, start, counts
        self.go = go  # set by the driver to start round 1
        self.failed = threading.Event()  # c10d survivors: "my workers failed" -> next rendezvous
        self.die = threading.Event()  # the victim: stop everything, as SIGKILL would
        self.done = threading.Event()  # driver: the run is over, leave
        self.wake = threading.Event()  # any of the three above
        self.monitoring = False  # in torchrun's monitor loop: the host's monitor asks num_nodes_waiting
        self.handler = None
        self.rounds: list[dict[str, Any]] = []
        self.signal_at: float | None = None  # when num_nodes_waiting() first said 1 after round 1
        self.error: BaseException | None = None

    def _count_store_ops(self) -> None:
        backend = self.handler._state_holder._backend
        call, set_state = backend._call_store, backend.set_state

        def counted(*a, **kw):
            result = call(*a, **kw)
            self.counts.add(1, _payload(a[1:]) + _payload(result))
            return result

        def counted_set(*a, **kw):  # torch's compare-and-set of the whole state; [2]: whether it won
            result = set_state(*a, **kw)
            self.counts.add(0, 0, 1, int(result is not None and not result[2]))
            return result

        backend._call_store, backend.set_state = counted, counted_set

    def member_id(self) -> list[Any]:
        h = self.handler
        if self.spec["handler"] == "etcd":
            return [h.me, h._member_rev]
        node = h._this_node
        return [node.addr, node.pid, node.local_id]

    def _round(self) -> None:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

        t0 = time.monotonic()
        info = self.handler.next_rendezvous()
        t_info = time.monotonic()
        spec = WorkerSpec(role="default", local_world_size=1, rdzv_handler=self.handler, entrypoint="sim")
        # torchrun's own rank assignment, as the launcher's agents run it (IDENTICAL_WORKERS_ENV, set by run());
        # it uses no agent state, so it runs unbound here
        workers = SimpleElasticAgent._assign_worker_ranks(None, info.store, info.rank, info.world_size, spec)
        self.rounds.append(
            {
                "start": t0,
                "info": t_info,
                "ranked": time.monotonic(),
                "rank": info.rank,
                "world": info.world_size,
                "global_rank": workers[0].global_rank,
                "member": self.member_id(),
            }
        )

    def _stop_like_sigkill(self) -> None:
        h = self.handler
        if self.spec["handler"] == "etcd":  # the lease thread, the closer and the watches stop; nothing revoked
            h._stop.set()
            h.round_view.stop()
        else:
            h._stop_heartbeats()

    def run(self) -> None:
        try:
            with _BUILDING:
                self.handler = _build_handler(self.spec)
            if self.spec["handler"] != "etcd":
                self._count_store_ops()
            self.start_barrier.wait()
            self.go.wait()
            self._round()
            self.monitoring = True  # the host's monitor thread asks num_nodes_waiting() for it (_AgentHost)
            self.wake.wait()
            self.monitoring = False
            if self.die.is_set():
                self._stop_like_sigkill()
                return
            if self.failed.is_set():
                self._round()
                self.done.wait()
            self.handler.shutdown()
        except BaseException as e:  # noqa: BLE001 - reported by the driver
            self.error = e
            self.start_barrier.abort()


#: How much lower the agents' worker processes' CPU priority is than the store's (``--procs``; nice increment).
AGENT_NICE = 10
#: The interpreter's thread switch interval in a worker process (``--procs``; CPython's default is 5 ms). A real
#: agent is a process of its own; here 128 simulated agents (~640 threads) share one interpreter lock, and with
#: the default hundreds of threads asking for it every 5 ms spent the cores on hand-offs (1,024 agents in 8
#: processes: ~175 % system time, a 10 ms sleep woke 20-36 s late, and the first round never formed; 50 ms:
#: 0.3-4 s late, measured 2026-11-27). Threads that wait for the network give the lock up at once either way.
SIM_SWITCH_INTERVAL_S = 0.05


class _AgentHost:
    """The simulated agents ``indices`` living in this process, and the events that drive them.

    What the agents of a process share (the simulation's own economy; the store sees the same calls): one
    monitor thread asks every agent's ``num_nodes_waiting()`` every :data:`MONITOR_INTERVAL_S` (torchrun's
    monitor loop, one per real agent). Each handler keeps its own threads (lease keep-alive, watches): renewing
    many leases from one thread would make each renewal wait for the others' when the store is slow."""

    def __init__(self, spec: dict[str, Any], indices: range) -> None:
        self.counts = _Counters()
        self.barrier, self.go = threading.Barrier(len(indices) + 1), threading.Event()
        self.agents = {i: SimAgent(i, spec, self.barrier, self.go, self.counts) for i in indices}
        self.at_once = spec["handler"] != "etcd"  # torch's c10d: survivors re-join when their workers fail
        self._stop = threading.Event()
        threading.Thread(target=self._monitor, name="sim-monitor", daemon=True).start()

    def _monitor(self) -> None:
        """torchrun's monitor loop for every agent of this process that has its place."""
        while not self._stop.wait(MONITOR_INTERVAL_S):
            for a in self.agents.values():
                if a.monitoring and not a.wake.is_set() and a.handler.num_nodes_waiting() > 0:
                    a.signal_at = time.monotonic() if a.signal_at is None else a.signal_at
                    a.failed.set()
                    a.wake.set()

    def start(self, timeout_s: float) -> None:
        for a in self.agents.values():
            a.start()
        self.barrier.wait(timeout=timeout_s)  # every handler connected: only the rendezvous is timed

    def kill(self, victim: int) -> None:
        if victim in self.agents:
            self.agents[victim].die.set()
            self.agents[victim].wake.set()
        if self.at_once:
            for i, a in self.agents.items():
                if i != victim:
                    a.failed.set()
                    a.wake.set()

    def finish(self) -> None:
        self._stop.set()
        for a in self.agents.values():
            a.done.set()
            a.wake.set()

    def errors(self) -> list[str]:
        """The agents' errors, causes first (one agent's failure breaks the others' start barrier)."""
        failed = [a for a in self.agents.values() if a.error is not None]
        failed.sort(key=lambda a: isinstance(a.error, threading.BrokenBarrierError))
        return [f"agent {a.idx}: {a.error!r}" for a in failed]

    def report(self, i: int) -> dict[str, Any]:
        a = self.agents[i]
        return {"rounds": a.rounds, "signal_at": a.signal_at}


class _ThreadPool:
    """Thread mode: every agent is a thread of this process (one GIL for all of them)."""

    def __init__(self, spec: dict[str, Any], nodes: int, timeout_s: float) -> None:
        self.host = _AgentHost(spec, range(nodes))
        self.host.start(timeout_s)
        self.pids = [os.getpid()]
        self._lag: list[float] = []
        self._stop_lag = threading.Event()
        threading.Thread(target=_lag_monitor, args=(self._stop_lag, self._lag), daemon=True).start()

    def go(self) -> None:
        self.host.go.set()

    def agent(self, i: int) -> dict[str, Any]:
        return self.host.report(i)

    def errors(self) -> list[str]:
        return self.host.errors()

    def counts(self) -> list[int]:
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
        _join_all(list(self.host.agents.values()), 10)


class _ProcPool:
    """Process mode: the agents are spread over ``procs`` worker processes (``--worker``), each running its share
    as threads with its own GIL; each reports its agents' rounds (monotonic clock times, shared by all processes
    of the machine), store-call counts and thread lag as JSON lines on its stdout."""

    def __init__(self, spec: dict[str, Any], nodes: int, procs: int, workdir: str, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._agents: dict[int, dict[str, Any]] = {i: {"rounds": [], "signal_at": None} for i in range(nodes)}
        self._errors: list[str] = []
        self._counts: dict[int, list[int]] = {}
        self._lag: dict[int, float] = {}
        self._ready: set[int] = set()
        self.procs: list[subprocess.Popen] = []
        self._stderr: list[str] = []
        bounds = [nodes * k // procs for k in range(procs + 1)]
        for k in range(procs):
            err = os.path.join(workdir, f"worker-{k}.err")
            self._stderr.append(err)
            argv = [
                sys.executable,
                "-m",
                "tools.rdzv_scale",
                "--worker",
                json.dumps(spec | {"first": bounds[k], "stop": bounds[k + 1]}),
            ]
            # below the store's CPU priority: on real nodes the agents do not take the store hosts' CPU
            p = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(err, "w"),
                text=True,
                bufsize=1,
                preexec_fn=lambda: os.nice(AGENT_NICE),
            )
            self.procs.append(p)
            threading.Thread(target=self._read, args=(k, p), daemon=True).start()
        self.pids = [p.pid for p in self.procs]
        try:
            self._wait_ready(procs, timeout_s)
        except BaseException:
            self.close()  # no orphaned agents left running against the next run's store
            raise

    def _wait_ready(self, procs: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self._ready) < procs:
            if self._errors:
                raise RuntimeError(f"a worker failed before the rendezvous: {self._errors[0]}")
            for k, p in enumerate(self.procs):
                if p.poll() is not None and k not in self._ready:
                    raise RuntimeError(
                        f"worker {k} exited with {p.returncode} before its handlers connected: {self._tail(k)}"
                    )
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
                for i, rep in msg.get("agents", {}).items():
                    self._agents[int(i)]["rounds"].extend(rep["rounds"])
                    if rep["signal_at"] is not None:
                        self._agents[int(i)]["signal_at"] = rep["signal_at"]
                self._errors.extend(msg.get("errors", []))
                if "counts" in msg:
                    self._counts[k] = msg["counts"]
                    self._lag[k] = msg["lag"]

    def _send(self, line: str) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    p.stdin.write(line + "\n")
                    p.stdin.flush()

    def go(self) -> None:
        self._send("go")

    def agent(self, i: int) -> dict[str, Any]:
        with self._lock:
            a = self._agents[i]
            return {"rounds": list(a["rounds"]), "signal_at": a["signal_at"]}

    def errors(self) -> list[str]:
        with self._lock:
            errs = list(self._errors)
        dead = [
            f"worker {k} exited with {p.returncode}: {self._tail(k)}"
            for k, p in enumerate(self.procs)
            if p.poll() not in (None, 0)
        ]
        return errs + dead

    def counts(self) -> list[int]:
        with self._lock:
            c = list(self._counts.values())
        return [sum(x[j] for x in c) for j in range(4)] if c else [0, 0, 0, 0]

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
    sys.setswitchinterval(SIM_SWITCH_INTERVAL_S)
    out = sys.stdout
    sys.stdout = sys.stderr  # stdout carries the reports alone

    def emit(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    host = _AgentHost(spec, range(spec["first"], spec["stop"]))
    try:
        host.start(spec["connect_s"])
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
    sent = {i: (0, None) for i in host.agents}
    reported: set[str] = set()

    def report() -> None:
        new = {}
        for i, a in host.agents.items():
            n, sig = sent[i]
            if len(a.rounds) > n or a.signal_at != sig:
                new[str(i)] = {"rounds": a.rounds[n:], "signal_at": a.signal_at}
                sent[i] = (len(a.rounds), a.signal_at)
        errs = [e for e in host.errors() if e not in reported]
        reported.update(errs)
        emit({"agents": new, "errors": errs, "counts": host.counts.snapshot(), "lag": max(lag, default=0.0)})

    while not stop.wait(0.05):
        report()
    _join_all(list(host.agents.values()), 5)  # survivors shut their handlers down
    report()
    return 0


# ---------------------------------------------------------------------------------------------- the stores
class _C10dStore:
    """torch's c10d side: one ``training.rdzv_store`` process; traffic counted in the handlers."""

    def __init__(self, workdir: str) -> None:
        from training.launch.local import start_store

        # its own directory: start_store takes an existing port file for the store's
        self.proc, self.port = start_store(tempfile.mkdtemp(dir=workdir), die_with_us=True)
        self.pids = [self.proc.pid]

    def spec(self, run_id: str) -> dict[str, Any]:
        return {"endpoint": f"127.0.0.1:{self.port}"}

    def counters(self, pool) -> tuple[float, float]:
        ops, nbytes, _, _ = pool.counts()
        return ops, nbytes

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class _EtcdStore:
    """The etcd side: a real 3-member cluster (TLS, auth); traffic from the members' own counters."""

    SERVICES = ("etcdserverpb.KV", "etcdserverpb.Lease", "etcdserverpb.Watch", "etcdserverpb.Auth")

    def __init__(self, workdir: str) -> None:
        from training.launch.rendezvous.members import LocalEtcd

        self.etcd = LocalEtcd.start(os.path.join(workdir, "etcd"), die_with_parent=True)
        self.pids = [m.process.pid for m in self.etcd.members]
        self.creds = None

    def spec(self, run_id: str) -> dict[str, Any]:
        from training.launch.rendezvous.client import EtcdClient

        self.creds = self.etcd.add_job_user(run_id)
        client = EtcdClient(self.creds)
        t = time.monotonic()
        client.get(client.key("rdzv/"))  # logs in
        self.login_s = time.monotonic() - t
        return {"creds": self.creds.as_env(), "token": client._token}

    def counters(self, pool=None) -> tuple[float, float]:
        """gRPC calls started (KV, lease, watch, auth; a lease keep-alive is a message on a kept-open stream, so
        those count by message) and gRPC message bytes in and out, summed over members."""
        import requests

        root = self.etcd.root_credentials()
        session = requests.Session()
        session.cert, session.trust_env = (root.cert, root.key), False
        ops = nbytes = 0.0
        for url in self.etcd.endpoints:
            text = session.get(f"{url}/metrics", verify=root.ca, timeout=10).text
            for line in text.splitlines():
                keep_alive = 'grpc_method="LeaseKeepAlive"' in line
                if (
                    line.startswith("grpc_server_started_total{")
                    and any(s in line for s in self.SERVICES)
                    and not keep_alive
                ):
                    ops += float(line.rsplit(" ", 1)[1])
                elif line.startswith("grpc_server_msg_received_total{") and keep_alive:
                    ops += float(line.rsplit(" ", 1)[1])
                elif re.match(r"etcd_network_client_grpc_(received|sent)_bytes_total ", line):
                    nbytes += float(line.rsplit(" ", 1)[1])
        return ops, nbytes

    def close(self) -> None:
        self.etcd.stop()


class _RoundWatch:
    """The driver's own watch on the job's prefix (etcd): when each key changed, as a watcher saw it."""

    def __init__(self, creds) -> None:
        from training.launch.rendezvous.client import EtcdClient

        self.client = EtcdClient(creds)
        self.prefix = self.client.key("rdzv/")
        self.events: list[tuple[float, str, str, str]] = []
        self._stop = threading.Event()
        _, rev = self.client.get_prefix(self.prefix)
        threading.Thread(target=self._run, args=(rev + 1,), daemon=True).start()

    def _run(self, rev: int) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                rev = self.client.watch(self.prefix, rev, self._on, self._stop)

    def _on(self, kind: str, kv) -> None:
        self.events.append((time.monotonic(), kind, kv.key[len(self.prefix) :].split("/", 1)[1], kv.value))

    def stop(self) -> None:
        self._stop.set()

    def first(self, after: float, pred) -> float:
        return next((t for t, kind, key, value in list(self.events) if t >= after and pred(kind, key, value)), NAN)

    def last(self, after: float, pred, until: float = float("inf")) -> float:
        """The last matching event's time from ``after`` on, not later than ``until`` (NaN: no bound)."""
        return max(
            (t for t, kind, key, value in list(self.events) if t >= after and not t > until and pred(kind, key, value)),
            default=NAN,
        )

    def round_seen(self, after: float, n: int, what: str) -> float:
        """When the round record ``n`` was first seen formed (``what`` "formed"), with its store published
        ("store"), open ("open") or either ("any")."""

        def pred(kind: str, key: str, value: str) -> bool:
            if kind != "PUT" or key != "round":
                return False
            r = json.loads(value)
            return (
                r["n"] == n
                and {"open": not r["formed"], "formed": r["formed"], "store": bool(r["store"]), "any": True}[what]
            )

        return self.first(after, pred)


# ---------------------------------------------------------------------------------------------- one run
def cpu_s(pid: int) -> float:
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
        self.c = {k: sum(cpu_s(p) for p in ps) for k, ps in pids.items()}

    def end(self) -> dict[str, float]:
        dt, m = time.monotonic() - self.t, _machine_cpu()
        out = {"machine": 100 * (m[0] - self.m[0]) / max(1, m[1] - self.m[1])}
        for k, ps in self.pids.items():
            with contextlib.suppress(OSError):
                out[k] = 100 * (sum(cpu_s(p) for p in ps) - self.c[k]) / dt
        return out


def _lag_monitor(stop: threading.Event, out: list[float]) -> None:
    """Keeps ``out`` as ``[the largest lag so far]`` (how late a 10 ms sleep woke)."""
    while not stop.is_set():
        t = time.monotonic()
        time.sleep(0.01)
        out[:] = [max(out[0] if out else 0.0, time.monotonic() - t - 0.01)]


def _wait_until(cond, timeout_s: float, what: str, pool) -> float:
    deadline = time.monotonic() + timeout_s
    while not cond():
        errors = pool.errors()
        if errors:
            raise RuntimeError(f"a simulated agent failed while waiting for {what}: {errors[0]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.01)
    return time.monotonic()


def _join_all(threads: list[threading.Thread], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def simulate(
    handler: str,
    nodes: int,
    store,
    *,
    procs: int = 1,
    steady_s: float = 2.0,
    timeout_s: float = 120.0,
    victim: str = "rank0",
    etcd_ttl_s: int = ETCD_TTL_S,
    say=print,
) -> ScaleResult:
    """Run the rounds of ``handler`` at ``nodes`` agents against ``store`` (:class:`_EtcdStore` or
    :class:`_C10dStore`); see the module docstring."""
    if nodes < 2:
        raise ValueError(f"--nodes {nodes}: need at least 2 (one dies, MIN = N-1 re-form)")
    run_id = f"scale-{handler}-{nodes}-{os.getpid()}"
    spec = {
        "handler": handler,
        "nodes": nodes,
        "run_id": run_id,
        "timeout_s": timeout_s,
        "etcd_ttl_s": etcd_ttl_s,
    } | store.spec(run_id)
    interval, attempts = HANDLERS[handler] or (etcd_ttl_s / 3, 3)
    base = ScaleResult(handler=handler, nodes=nodes, procs=procs, lease_s=interval * attempts)
    watch = _RoundWatch(store.creds) if handler == "etcd" else None
    base.login_s = getattr(store, "login_s", NAN)
    workdir = tempfile.mkdtemp(prefix="t5-rdzv-scale-")
    pool = None
    try:
        t0 = time.monotonic()
        spec["connect_s"] = timeout_s + nodes  # building is slow on a loaded machine (~0.5 s a handler at load 12)
        try:
            pool = (
                _ThreadPool(spec, nodes, spec["connect_s"])
                if procs == 1
                else _ProcPool(spec, nodes, procs, workdir, spec["connect_s"])
            )
        except (RuntimeError, TimeoutError, threading.BrokenBarrierError) as e:
            return replace(base, error=f"building the handlers: {type(e).__name__}: {e}")
        base = replace(base, connect_s=time.monotonic() - t0)
        say(
            f"[rdzv-scale] {handler} N={nodes}: {nodes} handlers connected in {base.connect_s:.1f} s "
            f"({'threads of this process' if procs == 1 else f'threads of {procs} processes'})"
        )
        rounds = lambda i: pool.agent(i)["rounds"]  # noqa: E731

        (ops0, _), c0 = store.counters(pool), pool.counts()
        cpu, t_go = _CpuWindow({"store": store.pids, "agents": pool.pids}), time.monotonic()
        pool.go()
        try:
            t_first = _wait_until(lambda: all(rounds(i) for i in range(nodes)), timeout_s, "the first round", pool)
        except (RuntimeError, TimeoutError) as e:
            done = sum(1 for i in range(nodes) if rounds(i))
            use = cpu.end()
            if watch:  # how far the round got: the phases seen so far, and how many agents had joined
                base.phases_first = _phases(watch, t_go, 0, [r[0] for r in map(rounds, range(nodes)) if r], None)
                joined = {key for _, kind, key, _ in list(watch.events) if key.startswith("joined/0/")}
                e = f"{e}; {len(joined)}/{nodes} joined keys seen"
            return replace(
                base,
                lag_ms_max=1000 * pool.lag_max_s(),
                cpu_machine_pct_first=use["machine"],
                cpu_store_pct_first=use.get("store", NAN),
                cpu_agents_pct_first=use.get("agents", NAN),
                error=f"first round: {done}/{nodes} agents ranked after {time.monotonic() - t_go:.0f} s; {e}",
            )
        use, first_s = cpu.end(), t_first - t_go
        ops1, b1 = store.counters(pool)
        c1 = pool.counts()
        base = replace(
            base,
            first_round_s=first_s,
            ops_per_s_first=(ops1 - ops0) / first_s,
            cas_lost_pct_first=100 * (c1[3] - c0[3]) / (c1[2] - c0[2]) if c1[2] > c0[2] else NAN,
            cpu_machine_pct_first=use["machine"],
            cpu_store_pct_first=use.get("store", NAN),
            cpu_agents_pct_first=use.get("agents", NAN),
        )
        if watch:
            base.phases_first = _phases(watch, t_go, 0, [rounds(i)[0] for i in range(nodes)], None)
        say(f"[rdzv-scale] {handler} N={nodes}: first round {first_s:.2f} s")

        time.sleep(0.5)  # let the last round-1 calls settle before the steady window
        (ops2, b2), cpu = store.counters(pool), _CpuWindow({"store": store.pids, "agents": pool.pids})
        time.sleep(steady_s)  # healthy agents: keep-alives and num_nodes_waiting
        (ops3, b3), use = store.counters(pool), cpu.end()
        base = replace(
            base,
            ops_per_s_steady=(ops3 - ops2) / steady_s,
            kib_per_s_steady=(b3 - b2) / 1024 / steady_s,
            cpu_store_pct_steady=use.get("store", NAN),
            cpu_agents_pct_steady=use.get("agents", NAN),
        )

        victim_idx = _victim(pool, nodes, handler, victim)
        dead = rounds(victim_idx)[0]["member"]
        if handler == "etcd":
            base.victim_was_closer = dead[1] == min(rounds(i)[0]["member"][1] for i in range(nodes))
        ops4, t_kill = store.counters(pool)[0], time.monotonic()
        pool.kill(victim_idx)
        survivors = [i for i in range(nodes) if i != victim_idx]
        try:
            t_reformed = _wait_until(
                lambda: all(len(rounds(i)) == 2 for i in survivors), timeout_s, "the re-formed round", pool
            )
        except (RuntimeError, TimeoutError) as e:
            return replace(base, lag_ms_max=1000 * pool.lag_max_s(), error=f"re-forming: {e}")
        ops5 = store.counters(pool)[0]
        second = [rounds(i)[1] for i in survivors]
        worlds = {r["world"] for r in second}
        base = replace(
            base,
            reform_s=t_reformed - t_kill,
            ops_per_s_reform=(ops5 - ops4) / (t_reformed - t_kill),
            reformed_world=worlds.pop() if len(worlds) == 1 else -1,
            reformed_ranks=sorted(r["global_rank"] for r in second),
            victim_in_new_round=any(r["member"] == dead for r in second),
            lag_ms_max=1000 * pool.lag_max_s(),
        )
        base.rejoined = sum(rounds(i)[1]["member"][0] != rounds(i)[0]["member"][0] for i in survivors)
        early = sum(r["start"] < t_kill for r in second)
        if early:  # a healthy agent's keep-alives were starved past its lease: it was "lost", and came back
            base.error = (
                f"{early} survivor(s) started their second round before the kill: a round re-formed while "
                f"every agent was healthy (an agent's own lease expired under this machine's load, "
                f"{base.rejoined} survivor(s) re-joined under a new id; or one joined after the first "
                f"round closed without it; sim lag {base.lag_ms_max:.0f} ms, agents "
                f"{base.cpu_agents_pct_steady:.0f} % CPU at steady): not a measurement (--etcd-ttl-s 3 "
                f"gives the keep-alives slack)"
            )
        if watch:
            signals = [pool.agent(i)["signal_at"] for i in survivors]
            base.phases_reform = _phases(watch, t_kill, 1, second, signals, lost=dead[0])
            base.lost_seen_s = base.phases_reform.get("lease expired", NAN)
        say(f"[rdzv-scale] {handler} N={nodes}: re-formed with {base.reformed_world} after {base.reform_s:.2f} s")
        return base
    finally:
        if pool is not None:
            pool.finish(5)  # survivors shut their handlers down (the store must still be there)
            pool.close()
        if watch:
            watch.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _victim(pool, nodes: int, handler: str, which: str) -> int:
    if which == "closer" and handler == "etcd":  # the oldest member: the lowest create revision
        return min(range(nodes), key=lambda i: pool.agent(i)["rounds"][0]["member"][1])
    return next(i for i in range(nodes) if pool.agent(i)["rounds"][0]["rank"] == 0)


def _phases(
    watch: _RoundWatch, t0: float, n: int, ranked: list[dict[str, Any]], signals: list | None, lost: str = ""
) -> dict[str, float]:
    """Seconds from ``t0`` until each step of round ``n`` (the etcd handler), as the driver's watch saw it."""
    out = {}
    if lost:
        out["lease expired"] = watch.first(t0, lambda k, key, v: k == "DELETE" and key == f"members/{lost}") - t0
        out["next round written"] = watch.round_seen(t0, n, "any") - t0
        out["last survivor told"] = max(s for s in signals if s is not None) - t0 if any(signals) else NAN
    formed_at = watch.round_seen(t0, n, "formed")
    # joins that formed the round (a re-formed round formed at once has none: its participants confirm later)
    out["last joined"] = (
        watch.last(t0, lambda k, key, v: k == "PUT" and key.startswith(f"joined/{n}/"), until=formed_at) - t0
    )
    out["closed (formed)"] = formed_at - t0
    out["store published"] = watch.round_seen(t0, n, "store") - t0
    out["last with its place"] = max((r["info"] for r in ranked), default=NAN) - t0
    out["last ranked"] = max((r["ranked"] for r in ranked), default=NAN) - t0
    return out


# ---------------------------------------------------------------------------------------------- workers' store
def _beat_driver(spec_json: str) -> int:
    """A client process of :func:`worker_store_load`: ranks ``first..stop-1``, one TCPStore connection each,
    ``threads`` threads beating them once a second as PeerWatchdog does; prints one JSON line at the end."""
    import torch.distributed as dist

    from training.job.watchdog import BEAT_S

    spec = json.loads(spec_json)
    ranks = list(range(spec["first"], spec["stop"]))
    clients = {
        r: dist.PrefixStore(
            "t5-failover/heartbeat/sim/",
            dist.TCPStore("127.0.0.1", spec["port"], is_master=False, timeout=timedelta(seconds=60)),
        )
        for r in ranks
    }
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # "go"
    stats = {"ops": 0, "bytes": 0, "lap_max": 0.0, "lat": []}
    lock = threading.Lock()
    end = time.monotonic() + spec["seconds"]

    def beat(mine: list[int]) -> None:
        beat_no, ops, nbytes, lat, lap_max = 0, 0, 0, [], 0.0
        while time.monotonic() < end:
            lap = time.monotonic()
            beat_no += 1
            for r in mine:
                peer = f"hb/{(r + 1) % spec['world']}"
                t = time.monotonic()
                s = clients[r]
                s.set(f"hb/{r}", str(beat_no))
                if s.check([peer]):
                    nbytes += len(s.get(peer))
                    ops += 1
                ops += 2
                nbytes += len(f"hb/{r}") + len(str(beat_no)) + 2 * len(peer)
                if r % 16 == 0:
                    lat.append(time.monotonic() - t)
            took = time.monotonic() - lap
            lap_max = max(lap_max, took)
            time.sleep(max(0.0, BEAT_S - took))
        with lock:
            stats["ops"] += ops
            stats["bytes"] += nbytes
            stats["lat"] += lat
            stats["lap_max"] = max(stats["lap_max"], lap_max)

    threads = [threading.Thread(target=beat, args=(ranks[k :: spec["threads"]],)) for k in range(spec["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(stats), flush=True)
    return 0


def _host_store(port_file: str) -> int:
    """The workers' store process: one TCPStore server (as rank 0's worker hosts it), until stdin closes."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(store.port))
    os.replace(port_file + ".tmp", port_file)
    sys.stdin.read()
    return 0


def worker_store_load(
    nodes: int, per_node: int, *, seconds: float = 5.0, procs: int = 4, threads: int = 8
) -> WorkerStoreResult:
    """``nodes`` x ``per_node`` ranks beating into one TCPStore for ``seconds``; see the module docstring."""
    ranks = nodes * per_node
    res = WorkerStoreResult(nodes=nodes, ranks=ranks, target_ops_per_s=3 * ranks)
    workdir = tempfile.mkdtemp(prefix="t5-worker-store-")
    port_file = os.path.join(workdir, "port")
    host = subprocess.Popen(
        [sys.executable, "-m", "tools.rdzv_scale", "--host-store", port_file], stdin=subprocess.PIPE, text=True
    )
    drivers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if host.poll() is not None or time.monotonic() > deadline:
                return replace(res, error="the workers' store did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        procs = max(1, min(procs, ranks))
        bounds = [ranks * k // procs for k in range(procs + 1)]
        for k in range(procs):
            spec = {
                "first": bounds[k],
                "stop": bounds[k + 1],
                "port": port,
                "world": ranks,
                "seconds": seconds,
                "threads": threads,
            }
            drivers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tools.rdzv_scale", "--beat-driver", json.dumps(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for d in drivers:
            if not json.loads(d.stdout.readline() or "{}").get("ready"):
                return replace(res, error="a client process did not connect its ranks")
        cpu = _CpuWindow({"store": [host.pid], "clients": [d.pid for d in drivers]})
        for d in drivers:
            d.stdin.write("go\n")
            d.stdin.flush()
        stats = [json.loads(d.stdout.readline()) for d in drivers]
        use = cpu.end()
        lat = sorted(x for s in stats for x in s["lat"])
        return replace(
            res,
            ops_per_s=sum(s["ops"] for s in stats) / seconds,
            kib_per_s=sum(s["bytes"] for s in stats) / 1024 / seconds,
            op_ms_p50=1000 * statistics.median(lat) / 3 if lat else NAN,
            op_ms_max=1000 * max(lat) if lat else NAN,
            lap_s_max=max(s["lap_max"] for s in stats),
            cpu_machine_pct=use["machine"],
            cpu_store_pct=use.get("store", NAN),
            cpu_clients_pct=use.get("clients", NAN),
        )
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
            d.wait(timeout=30)
        host.stdin.close()
        host.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- tables
COLUMNS = [
    ("handler", "handler", "{}"),
    ("N", "nodes", "{:d}"),
    ("procs", "procs", "{:d}"),
    ("lease s", "lease_s", "{:g}"),
    ("connect s", "connect_s", "{:.1f}"),
    ("login s", "login_s", "{:.2f}"),
    ("first round s", "first_round_s", "{:.2f}"),
    ("re-formed s", "reform_s", "{:.2f}"),
    ("ops/s 1st", "ops_per_s_first", "{:.0f}"),
    ("ops/s steady", "ops_per_s_steady", "{:.0f}"),
    ("KiB/s steady", "kib_per_s_steady", "{:.1f}"),
    ("ops/s re-form", "ops_per_s_reform", "{:.0f}"),
    ("CAS lost % 1st", "cas_lost_pct_first", "{:.0f}"),
    ("sim lag max ms", "lag_ms_max", "{:.0f}"),
    ("CPU % machine 1st", "cpu_machine_pct_first", "{:.0f}"),
    ("CPU % store 1st", "cpu_store_pct_first", "{:.0f}"),
    ("CPU % agents 1st", "cpu_agents_pct_first", "{:.0f}"),
    ("CPU % store steady", "cpu_store_pct_steady", "{:.0f}"),
    ("CPU % agents steady", "cpu_agents_pct_steady", "{:.0f}"),
    ("N-1 ranks ok", "ok", "{}"),
]
PHASES_FIRST = ["last joined", "closed (formed)", "store published", "last with its place", "last ranked"]
PHASES_REFORM = ["lease expired", "next round written", "last survivor told"] + PHASES_FIRST
WORKER_COLUMNS = [
    ("N", "nodes", "{:d}"),
    ("ranks", "ranks", "{:d}"),
    ("ops/s needed", "target_ops_per_s", "{:.0f}"),
    ("ops/s done", "ops_per_s", "{:.0f}"),
    ("KiB/s", "kib_per_s", "{:.0f}"),
    ("op ms p50", "op_ms_p50", "{:.2f}"),
    ("beat ms max", "op_ms_max", "{:.1f}"),
    ("lap s max", "lap_s_max", "{:.2f}"),
    ("CPU % machine", "cpu_machine_pct", "{:.0f}"),
    ("CPU % store", "cpu_store_pct", "{:.0f}"),
    ("CPU % clients", "cpu_clients_pct", "{:.0f}"),
]


def _cell(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return fmt.format(v)


def _markdown(columns: list[tuple[str, str, str]], rows: list[Any]) -> list[str]:
    head = "| " + " | ".join(c for c, _, _ in columns) + " |"
    rule = "|" + "|".join("---:" for _ in columns) + "|"
    return [head, rule] + ["| " + " | ".join(_cell(getattr(r, a), f) for _, a, f in columns) + " |" for r in rows]


def table(results: list[ScaleResult], workers: list[WorkerStoreResult] = ()) -> str:
    """Markdown tables: one row per handler and node count; the etcd phases; the workers' store."""
    out = _markdown(COLUMNS, results)
    out += [f"{r.handler} N={r.nodes}: {r.error}" for r in results if r.error]
    etcd = [r for r in results if r.phases_first or r.phases_reform]
    if etcd:
        out += [
            "",
            "etcd handler, seconds from the start of the round (first) or from the kill (re-formed), "
            "as the driver's watch saw each step:",
            "",
        ]
        cols = ["N", "round"] + PHASES_REFORM
        out += ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
        for r in etcd:
            for name, ph in (("first", r.phases_first), ("re-formed", r.phases_reform)):
                if ph:
                    out.append(
                        "| "
                        + " | ".join([str(r.nodes), name] + [_cell(ph.get(p), "{:.2f}") for p in PHASES_REFORM])
                        + " |"
                    )
    if workers:
        out += [
            "",
            "Workers' store (heartbeats: every rank sets its counter and reads its peer's once a second, "
            "one TCPStore):",
            "",
        ]
        out += _markdown(WORKER_COLUMNS, list(workers))
        out += [f"workers' store N={w.nodes}: {w.error}" for w in workers if w.error]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- CLI
class _Usage(ValueError):
    """A bad command-line value: one line, exit 2."""


def _nodes(raw: str) -> list[int]:
    try:
        ns = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes {raw!r}: expected comma-separated integers, e.g. 16,64") from None
    if not ns or min(ns) < 2:
        raise argparse.ArgumentTypeError(f"--nodes {raw!r}: each count must be >= 2 (one node dies)")
    return ns


def _handlers(raw: str) -> list[str]:
    hs = [x.strip() for x in raw.split(",") if x.strip()]
    bad = [h for h in hs if h not in HANDLERS]
    if not hs or bad:
        raise argparse.ArgumentTypeError(f"--handlers {raw!r}: expected some of {','.join(HANDLERS)}")
    return hs


def run(
    nodes: list[int],
    handlers: list[str],
    *,
    procs: int = 1,
    steady_s: float = 2.0,
    timeout_s: float = 180.0,
    victim: str = "rank0",
    worker_ranks: int = 8,
    worker_s: float = 5.0,
    etcd_ttl_s: int = ETCD_TTL_S,
    say=print,
) -> tuple[list[ScaleResult], list[WorkerStoreResult]]:
    """Every handler at every node count (each against a fresh store), then the workers' store rows."""
    os.environ.update(IDENTICAL_WORKERS_ENV)  # the launcher's agents' rank assignment (inherited by the workers)
    results = []
    workdir = tempfile.mkdtemp(prefix="t5-rdzv-scale-")
    log = os.path.join(workdir, "handlers.log")
    for h in handlers:
        store = _EtcdStore(workdir) if h == "etcd" else None
        try:
            for n in nodes:
                one = store or _C10dStore(workdir)
                try:
                    # the handlers' per-agent lines ("[rendezvous] round 0: rank ...") go to a file
                    with open(log, "a") as f, contextlib.redirect_stderr(f):
                        results.append(
                            simulate(
                                h,
                                n,
                                one,
                                procs=procs,
                                steady_s=steady_s,
                                timeout_s=timeout_s,
                                victim=victim,
                                etcd_ttl_s=etcd_ttl_s,
                                say=say,
                            )
                        )
                finally:
                    if one is not store:
                        one.close()
        finally:
            if store is not None:
                store.close()
    shutil.rmtree(workdir, ignore_errors=True)  # etcd's data (~250 MB of preallocated WAL) and the handlers' log
    workers = []
    for n in nodes if worker_ranks else []:
        workers.append(worker_store_load(n, worker_ranks, seconds=worker_s))
        say(f"[rdzv-scale] workers' store N={n} x {worker_ranks}: {workers[-1].ops_per_s:.0f} ops/s")
    return results, workers


#: About how many agents' watches fill three members of an etcd whose TLS connections carry at most 250 streams.
STREAM_CAP_AGENTS = 300


def stream_capped(version: str) -> bool:
    """Whether etcd ``version`` serves at most 250 concurrent streams on a TLS client connection, which its JSON
    gateway shares for all of a member's requests (etcd-io/etcd#14169: fixed in 3.4.20 and 3.5.5)."""
    parts = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    return parts < (3, 4, 20) or (3, 5, 0) <= parts < (3, 5, 5)


def stream_cap_note() -> str:
    """One line when the etcd this run starts is :func:`stream_capped`, naming the fix; else ""."""
    from training.launch.rendezvous.members import etcd_binary

    binary = etcd_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    version = re.search(r"etcd Version: (\S+)", out)
    if version is None or not stream_capped(version.group(1)):
        return ""
    return (
        f"note: {binary} is etcd {version.group(1)}, whose members serve at most 250 concurrent streams per "
        f"TLS connection (etcd-io/etcd#14169): beyond ~{STREAM_CAP_AGENTS} agents every call waits behind the "
        f"agents' watches; set T5_ETCD_BIN to an etcd >= 3.4.20 / 3.5.5 (Debian 12: apt install etcd-server, "
        f"then T5_ETCD_BIN=/usr/bin/etcd)"
    )


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(
        prog="python -m tools.rdzv_scale",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=_nodes, default=[16, 64], help="simulated agent counts (default 16,64)")
    p.add_argument(
        "--handlers", type=_handlers, default=list(HANDLERS), help=f"which handlers (default {','.join(HANDLERS)})"
    )
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        help="spread the agents over this many worker processes, each with its own GIL (default 1: "
        "all agents are threads of this process)",
    )
    p.add_argument(
        "--steady-s",
        type=float,
        default=2.0,
        help="seconds of healthy agents between the rounds (steady store load; default 2)",
    )
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up on a round after this (default 180)")
    p.add_argument(
        "--etcd-ttl-s",
        type=int,
        default=ETCD_TTL_S,
        help=f"the etcd agents' lease TTL; they renew it every third of that (default {ETCD_TTL_S}: the "
        "launcher's). Longer: fewer keep-alives for this machine to carry, and a lost node "
        "is found later (the table's 'lease s' and the phases' 'lease expired' say so)",
    )
    p.add_argument(
        "--victim",
        choices=("rank0", "closer"),
        default="rank0",
        help="which agent dies: the round's rank 0 (default) or, for etcd, the closer",
    )
    p.add_argument(
        "--worker-ranks",
        type=int,
        default=8,
        help="ranks per node in the workers' store rows (default 8; 0: no such rows)",
    )
    p.add_argument("--worker-s", type=float, default=5.0, help="seconds of heartbeats per workers' store row")
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--system-resolver",
        action="store_true",
        help="look loopback peers up through this machine's DNS server, as torch's TCPStore asks it to "
        "(default: named in a private /etc/hosts when run as root; see tools/loopback_names.py)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: a worker process of --procs
    p.add_argument("--beat-driver", help=argparse.SUPPRESS)  # internal: a client process of the workers' store
    p.add_argument("--host-store", help=argparse.SUPPRESS)  # internal: the workers' store
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker)
    if a.beat_driver:
        return _beat_driver(a.beat_driver)
    if a.host_store:
        return _host_store(a.host_store)
    if a.procs < 1 or a.procs > min(a.nodes):
        p.error(
            f"--procs {a.procs}: expected 1 (threads of this process) up to the smallest --nodes "
            f"({min(a.nodes)}): each worker process runs at least one agent"
        )
    if a.worker_ranks < 0 or a.steady_s <= 0 or a.worker_s <= 0:
        p.error(
            f"--worker-ranks {a.worker_ranks} / --steady-s {a.steady_s:g} / --worker-s {a.worker_s:g}: "
            f"expected ranks >= 0 and positive seconds, e.g. --worker-ranks 8 --steady-s 2 --worker-s 5"
        )
    if a.etcd_ttl_s < ETCD_MIN_LEASE_S:
        p.error(
            f"--etcd-ttl-s {a.etcd_ttl_s}: expected whole seconds >= {ETCD_MIN_LEASE_S} (etcd's shortest "
            f"lease), e.g. {ETCD_TTL_S} (the launcher's)"
        )
    if not loopback_names.named_here():
        why = "--system-resolver" if a.system_resolver else loopback_names.unavailable()
        if why is None:
            print(
                "[rdzv-scale] loopback peers named in a private /etc/hosts: torch's TCPStore looks every peer "
                "up, and this machine's DNS server drops bursts of those queries (--system-resolver keeps it)",
                flush=True,
            )
            return loopback_names.run_named(
                [sys.executable, "-m", "tools.rdzv_scale", *(sys.argv[1:] if argv is None else argv)]
            )
        # the resolver's 5 s timeout per dropped query, cut to 1 s (inherited by the worker processes)
        os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
        print(
            f"[rdzv-scale] loopback peers looked up through this machine's DNS server ({why}): store "
            f"connects wait for the queries it drops",
            flush=True,
        )
    import logging

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    print(
        f"[rdzv-scale] last call {LAST_CALL_S} s; etcd lease {a.etcd_ttl_s} s "
        f"(renewed every {a.etcd_ttl_s / 3:.2g} s); c10d keep-alive: "
        f"torch's default 5 s x 3 (c10d), 1 s x 3 (c10d-1x3)",
        flush=True,
    )
    if "etcd" in a.handlers and max(a.nodes) > STREAM_CAP_AGENTS:
        note = stream_cap_note()
        if note:
            print(f"[rdzv-scale] {note}", flush=True)
    try:
        results, workers = run(
            a.nodes,
            a.handlers,
            procs=a.procs,
            steady_s=a.steady_s,
            timeout_s=a.timeout_s,
            victim=a.victim,
            worker_ranks=a.worker_ranks,
            worker_s=a.worker_s,
            etcd_ttl_s=a.etcd_ttl_s,
            say=lambda m: print(m, flush=True),
        )
    except Exception as e:  # noqa: BLE001 - a store that did not start (no etcd binary, ...): one line
        print(f"[rdzv-scale] {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print()
    print(table(results, workers))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "rendezvous": [dataclasses.asdict(r) | {"ok": r.ok} for r in results],
                    "workers_store": [dataclasses.asdict(w) for w in workers],
                },
                f,
                indent=1,
                default=str,
            )
    bad = [f"{r.handler} N={r.nodes}" for r in results if not r.ok]
    if bad:
        print(f"[rdzv-scale] not formed or wrong: {', '.join(bad)} (see the table)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

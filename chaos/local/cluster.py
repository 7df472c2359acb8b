"""Simulated nodes on loopback: the membership store (3 etcd members, or the standalone c10d store) + one torchrun
agent per node.

Every agent runs the exact command line of ``training.launch`` (``torchrun_argv``). Output of each agent
(and its workers) is timestamped line by line as it arrives, so the harness can tell when a failure was
noticed. Only processes started here are ever signalled: agents are our children, workers are checked to
be descendants of one of our agents before anything is sent to them. The store and the agents die with the
harness (the kernel's parent-death signal, :mod:`training.job.lifecycle`), so a harness stopped in any way, even
between starting a process and recording it, leaves none behind. Workers are found by their process
name (``t5f-rank-N``, :func:`training.job.lifecycle.worker_rank`): warm workers are forked by the agent's
forkserver, so their ``/proc/PID/environ`` does not carry RANK.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from training.config import MEMORY_DIR_ENV
from training.launch import LaunchConfig, launch_env, start_store, torchrun_argv
from training.job.lifecycle import PARENT_ENV, worker_rank


class ClusterError(RuntimeError):
    """The simulated cluster could not do what a scenario asked (message says what and why)."""


class LogTap:
    """Reads a process's output on a thread; keeps ``(time, line)`` and writes ``<time> <line>`` to a file."""

    def __init__(self, stream, path: Path):
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._file = open(path, "w", buffering=1)
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        for line in iter(stream.readline, ""):
            t = time.time()
            line = line.rstrip("\n")
            with self._lock:
                self.lines.append((t, line))
            self._file.write(f"{t:.3f} {line}\n")
        self._file.close()

    def snapshot(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.lines)

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)


@dataclass
class Node:
    """One launch of simulated node ``index`` (a restarted node is a new Node with a higher generation)."""

    index: int
    generation: int
    proc: subprocess.Popen
    tap: LogTap
    started: float
    ended: float | None = None

    @property
    def name(self) -> str:
        return f"node{self.index}" + (f".{self.generation}" if self.generation else "")


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R, S, T = stopped, Z = zombie, ...); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def confirm(pid: int, sig: signal.Signals, timeout: float = 5.0) -> tuple[bool, str]:
    """Whether ``sig`` took effect on ``pid`` (gone or a zombie for SIGKILL, stopped for SIGSTOP), and how we know."""
    want = {signal.SIGKILL: (None, "Z", "X"), signal.SIGSTOP: ("T", "t")}.get(sig)
    if want is None:
        return True, f"{signal.Signals(sig).name} delivered to pid {pid}"
    deadline = time.monotonic() + timeout
    while True:
        st = _state(pid)
        if st in want:
            return True, f"pid {pid} {'stopped' if sig == signal.SIGSTOP else 'is gone'} (/proc state {st or 'none'})"
        if time.monotonic() > deadline:
            return False, f"pid {pid} still in state {st} {timeout:.0f} s after {signal.Signals(sig).name}"
        time.sleep(0.02)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children first): an agent's forkserver and the workers it forked."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):  # one scan for the whole tree
        if d.isdigit() and (parent := _ppid(int(d))) is not None:
            kids.setdefault(parent, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        found = sorted(kids.get(todo.pop(0), []))
        out += found
        todo += found
    return out


@dataclass
class LocalCluster:
    """A store plus ``launch.max_nodes`` (+ ``launch.spares``) agents under ``workdir`` (logs in ``workdir/logs``).

    Attributes:
        workdir: scenario directory (the job's out_dir lives inside it too).
        launch: the agents' LaunchConfig; its endpoint is replaced by the store this cluster starts.
        events: what the harness did, in order: ``{"time", "kind", "node", "detail"}``.
    """

    workdir: Path
    launch: LaunchConfig
    events: list[dict] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    store: subprocess.Popen | None = None
    etcd: object | None = None  # training.launch.rendezvous.members.LocalEtcd (coordinator etcd)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    # ---- lifecycle --------------------------------------------------------------------------------
    def start_store(self) -> None:
        # dies with the harness however it ends (Ctrl-C mid-start, SIGTERM, SIGKILL): close() may never run
        if self.launch.coordinator == "etcd":
            from training.launch.rendezvous.members import LocalEtcd

            self.etcd = LocalEtcd.start(str(self.workdir / "etcd"), die_with_parent=True)
            self._etcd_user()
            pids = ", ".join(str(m.process.pid) for m in self.etcd.members)
            self.event("store", None, f"etcd members pids {pids} ({', '.join(self.etcd.endpoints)})")
            return
        self.store, port = start_store(str(self.workdir), self.launch.python, die_with_us=True)
        self.launch = replace(self.launch, rdzv_endpoint=f"127.0.0.1:{port}", external_store=True)
        self.event("store", None, f"rendezvous store pid {self.store.pid} on port {port}")

    def start_node(self, index: int, *, kind: str = "start") -> Node:
        gen = sum(1 for n in self.nodes if n.index == index)
        env = launch_env(self.launch)
        # INFO shows the agent's own decisions (worker group FAILED / restarting / new nodes waiting).
        env.update(LOGLEVEL="INFO", OMP_NUM_THREADS="1", T5_NODE_RANK=str(index))
        env[PARENT_ENV] = str(os.getpid())  # SIGTERM to the agent if the harness dies (it stops its workers)
        env[MEMORY_DIR_ENV] = str(self.node_memory(index))  # this node's "RAM" for in-memory snapshots
        name = f"node{index}" + (f".{gen}" if gen else "")
        proc = subprocess.Popen(
            torchrun_argv(self.launch),
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        node = Node(index, gen, proc, LogTap(proc.stdout, self.workdir / "logs" / f"{name}.log"), time.time())
        self.nodes.append(node)
        self.event(kind, index, f"agent pid {proc.pid}")
        return node

    def start_all(self, *, kind: str = "start") -> None:
        if self.store is None and self.etcd is None:
            self.start_store()
        for i in range(self.launch.max_nodes + self.launch.spares):  # hot spares: the last to join wait
            self.start_node(i, kind=kind)

    def _etcd_user(self) -> None:
        """This rendezvous id's etcd user, its credentials in the agents' environment."""
        creds = self.etcd.add_job_user(self.launch.rdzv_id)
        self.launch = replace(
            self.launch,
            etcd_env=tuple(sorted(creds.as_env().items())),
            rdzv_endpoint=creds.endpoints[0].split("//", 1)[1],
        )

    def store_alive(self) -> bool:
        """The membership store still serves: the c10d store process, or a majority of etcd members."""
        if self.etcd is not None:
            running = [m for m in self.etcd.members if m.process and m.process.poll() is None]
            return len(running) * 2 > len(self.etcd.members)
        return self.store is not None and self.store.poll() is None

    def relaunch(self, rdzv_id: str) -> None:
        """A new attempt of the whole job (e.g. after preemption): same store, new rendezvous id."""
        self.launch = replace(self.launch, rdzv_id=rdzv_id)
        if self.etcd is not None:
            self._etcd_user()
        self.start_all(kind="relaunch")

    def event(
        self,
        kind: str,
        node: int | None,
        detail: str,
        *,
        label: str = "",
        agents_hit: tuple[str, ...] = (),
        t: float | None = None,
        confirmed: bool = True,
        evidence: str = "",
    ) -> dict:
        """Record what the harness did (at ``t``, default now). ``label`` names a fault for the report;
        ``agents_hit`` lists the agents the fault itself killed or signalled (their exit codes are expected to
        be non-zero); ``confirmed``/``evidence``: whether and how the fault's effect was verified."""
        ev = {
            "time": time.time() if t is None else t,
            "kind": kind,
            "node": node,
            "detail": detail,
            "label": label or kind,
            "agents_hit": list(agents_hit),
            "confirmed": confirmed,
            "evidence": evidence or detail,
        }
        self.events.append(ev)
        print(
            f"[chaos]   {time.strftime('%H:%M:%S')} {kind}{'' if node is None else f' node{node}'}: {detail}",
            flush=True,
        )
        return ev

    # ---- inspection -------------------------------------------------------------------------------
    def current(self, index: int) -> Node:
        for n in reversed(self.nodes):
            if n.index == index:
                return n
        raise ClusterError(f"node{index} was never started")

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def workers(self, index: int) -> list[int]:
        """Worker pids of node ``index``'s current agent."""
        agent = self.current(index).proc
        if agent.poll() is not None:
            return []
        return [p for p in descendants(agent.pid) if worker_rank(p) is not None]

    def processes(self, index: int) -> list[int]:
        """Node ``index``'s current agent and every process under it (forkserver, workers): the whole node."""
        agent = self.current(index).proc
        return [] if agent.poll() is not None else [agent.pid, *descendants(agent.pid)]

    def rank_of(self, pid: int) -> int | None:
        return worker_rank(pid)

    def node_of_rank(self, rank: int) -> int | None:
        """The node whose running worker has global rank ``rank`` now. A stopped worker (a silent node, a hung
        worker) keeps the name of its old rank, which the next round may have given to another node's worker."""
        for n in sorted({n.index for n in self.nodes}):
            if any(self.rank_of(p) == rank and _state(p) not in ("T", "t") for p in self.workers(n)):
                return n
        return None

    def log_lines(self) -> list[tuple[float, str, str]]:
        """Every node's timestamped output: ``(time, node name, line)`` sorted by time."""
        out = [(t, n.name, line) for n in self.nodes for t, line in n.tap.snapshot()]
        return sorted(out)

    # ---- faults -----------------------------------------------------------------------------------
    def _verified_worker(self, index: int, pid: int) -> None:
        if pid not in descendants(self.current(index).proc.pid):
            raise ClusterError(f"pid {pid} is not a worker of node{index}'s agent: refusing to signal it")

    def signal_worker(self, index: int, sig: signal.Signals, *, rank: int | None = None) -> int:
        """Send ``sig`` to one worker of node ``index`` (the given global rank, else the first)."""
        pids = self.workers(index)
        if rank is not None:
            pids = [p for p in pids if self.rank_of(p) == rank]
        if not pids:
            raise ClusterError(
                f"node{index} has no running worker" + (f" with rank {rank}" if rank is not None else "")
            )
        pid = pids[0]
        self._verified_worker(index, pid)
        rank = self.rank_of(pid)  # read before the signal: a killed process has no /proc entry
        t = time.time()
        os.kill(pid, sig)
        ok, how = confirm(pid, sig)
        name = signal.Signals(sig).name
        self.event(
            "fault",
            index,
            f"{name} worker pid {pid} (rank {rank})",
            label=f"{name} worker",
            t=t,
            confirmed=ok,
            evidence=how,
        )
        return pid

    def node_memory(self, index: int) -> Path:
        """Node ``index``'s shared memory (its /dev/shm on a real machine): lost with the node."""
        return self.workdir / "node-memory" / f"node{index}"

    def kill_node(self, index: int, *, record: bool = True) -> None:
        """SIGKILL node ``index``: its agent and every worker, as if the machine lost power (and its memory:
        the node's in-memory snapshots are deleted)."""
        self.kill_nodes([index], record=record)

    def kill_nodes(self, indices: list[int], *, record: bool = True) -> None:
        """SIGKILL several nodes at the same moment (one fault: e.g. a rack's power): agents, workers, memory."""
        nodes = [self.current(i) for i in indices]
        pids = {i: self.workers(i) for i in indices}  # collect first: once an agent is gone its workers are reparented
        under = [p for i in indices for p in self.processes(i)[1:]]  # workers and the forkserver
        t = time.time()
        for node in nodes:
            if node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGKILL)
        for p in under:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for i in indices:
            shutil.rmtree(self.node_memory(i), ignore_errors=True)
        if not record:
            return
        for node in nodes:
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        every = [p for i in indices for p in pids[i]]
        gone = [confirm(p, signal.SIGKILL)[0] for p in every]
        ok = all(n.proc.poll() is not None for n in nodes) and all(pids.values()) and all(gone)
        names = ", ".join(f"node{i}" for i in indices)
        agents = ", ".join(str(n.proc.pid) for n in nodes)
        self.event(
            "fault",
            indices[0] if len(indices) == 1 else None,
            f"SIGKILL {names} (agent(s) {agents} + workers {every})",
            label="SIGKILL node" if len(indices) == 1 else f"SIGKILL {len(indices)} nodes",
            agents_hit=tuple(n.name for n in nodes),
            t=t,
            confirmed=ok,
            evidence=f"agent exit code(s) {[n.proc.poll() for n in nodes]}, {sum(gone)}/{len(every)} workers "
            f"gone, node memory wiped: {all(not self.node_memory(i).exists() for i in indices)}",
        )

    def stop_node(self, index: int) -> None:
        """SIGSTOP node ``index``'s agent and workers: a silent node (power lost with the NIC up, a kernel hang, a
        partition). Its processes stay alive with their sockets open, so no peer hears of it from the kernel."""
        node = self.current(index)
        pids, workers = self.processes(index), self.workers(index)
        t = time.time()
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        states = [confirm(p, signal.SIGSTOP) for p in pids]
        self.event(
            "fault",
            index,
            f"SIGSTOP node{index} (agent {node.proc.pid} + workers {workers}, {len(pids)} processes)",
            label="SIGSTOP node",
            agents_hit=(node.name,),
            t=t,
            confirmed=bool(workers) and all(ok for ok, _ in states),
            evidence="; ".join(how for _, how in states),
        )

    def slow_node(self, index: int, *, stopped_s: float = 0.2, period_s: float = 0.3) -> "DutyCycle":
        """Slow node ``index`` to (period - stopped) / period of its speed, from now until :meth:`DutyCycle.stop` or
        until the node's agent is gone: its agent and every process under it are stopped (SIGSTOP) for
        ``stopped_s`` of every ``period_s``, then continued. A node that runs slowly, not a silent one: each stop is
        shorter than any heartbeat or keep-alive timeout. The fault is recorded once the first stop took effect."""
        return DutyCycle(self, index, stopped_s, period_s).start()

    def signal_everything(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of every node: agents, forkservers, workers (a preemption notice to the
        whole job, as Slurm sends it to every process of a step)."""
        targets, hit, delivered = [], [], []
        for n in self.alive():
            targets += self.processes(n.index)
            hit.append(n.name)
        named = {p for p in targets if worker_rank(p) is not None}  # read before the signal ends them
        t = time.time()
        for p in targets:
            try:
                os.kill(p, sig)
                delivered.append(p)
            except ProcessLookupError:
                pass
        name = signal.Signals(sig).name
        workers = [p for p in delivered if p in named]
        self.event(
            "fault",
            None,
            f"{name} to every process {targets}",
            label=f"{name} all",
            agents_hit=tuple(hit),
            t=t,
            confirmed=bool(workers),
            evidence=f"delivered to {len(delivered)}/{len(targets)} processes ({len(workers)} workers)",
        )

    # ---- waiting and cleanup ----------------------------------------------------------------------
    def wait_exit(self, timeout: float) -> dict[str, int | None]:
        """Wait for every agent to exit; returns exit codes by node name (None = still running)."""
        deadline = time.monotonic() + timeout
        for n in self.nodes:
            try:
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._stamp_ends()
        return {n.name: n.proc.poll() for n in self.nodes}

    def _stamp_ends(self) -> None:
        for n in self.nodes:
            if n.ended is None and n.proc.poll() is not None:
                n.ended = time.time()

    def exit_codes(self) -> dict[str, int | None]:
        self._stamp_ends()
        return {n.name: n.proc.poll() for n in self.nodes}

    def close(self) -> None:
        """Stop everything this cluster started (SIGKILL works on stopped processes too)."""
        for n in self.nodes:
            if n.proc.poll() is None:
                for p in self.processes(n.index)[1:] if n is self.current(n.index) else []:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                n.proc.kill()
            n.proc.wait()
            n.tap.join()
        self._stamp_ends()
        if self.etcd is not None:
            for m in self.etcd.members:  # a scenario may have left them stopped
                if m.process and m.process.poll() is None:
                    m.process.send_signal(signal.SIGCONT)
            self.etcd.stop()
        if self.store is not None and self.store.poll() is None:
            self.store.terminate()
            try:
                self.store.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.store.kill()
                self.store.wait()


class DutyCycle:
    """A thread that stops and continues one simulated node's processes (see :meth:`LocalCluster.slow_node`).
    ``cycles``: the stop/continue cycles done; :meth:`stop` ends it and continues whatever is still stopped."""

    def __init__(self, cluster: LocalCluster, index: int, stopped_s: float, period_s: float):
        self.cluster, self.index = cluster, index
        self.stopped_s, self.running_s = stopped_s, max(0.0, period_s - stopped_s)
        self.cycles = 0
        self._quit = threading.Event()
        self._stopped: list[int] = []
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"slow-node{index}", daemon=True)

    def start(self) -> "DutyCycle":
        node = self.cluster.current(self.index)
        workers = self.cluster.workers(self.index)
        t = time.time()
        self._thread.start()
        self._first.wait(timeout=10)
        ok, how = self._first_confirmed
        self.cluster.event(
            "fault",
            self.index,
            f"slow node{self.index}: agent {node.proc.pid} + workers {workers} "
            f"stopped {self.stopped_s:g} s of every {self.stopped_s + self.running_s:g} s",
            label="slow node (stop/continue duty cycle)",
            t=t,
            confirmed=ok and bool(workers),
            evidence=how,
        )
        return self

    _first_confirmed: tuple[bool, str] = (False, "the duty cycle never stopped a process")

    def _run(self) -> None:
        while not self._quit.is_set():
            pids = self.cluster.processes(self.index)
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGSTOP)
                    self._stopped.append(p)
                except ProcessLookupError:
                    pass
            if not self._first.is_set():
                self._first_confirmed = confirm(pids[-1], signal.SIGSTOP, timeout=1.0)
                self._first.set()
            self._quit.wait(self.stopped_s)
            self._continue()
            self.cycles += 1
            self._quit.wait(self.running_s)
        self._first.set()

    def _continue(self) -> None:
        for p in self._stopped:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._stopped = []

    def stop(self) -> int:
        """End the slowdown (every process continued); returns the cycles done."""
        self._quit.set()
        self._thread.join(timeout=5)
        self._continue()
        return self.cycles

"""Scale simulation of the c10d rendezvous against the standalone store: first round and re-forming after a node loss.

Each simulated agent is a real torch ``DynamicRendezvousHandler`` (c10d backend, ``is_host=false``) built from
the launcher's own torchrun command line (:func:`training.launch.commands.torchrun_argv`, parsed by torchrun),
with the agent's patches applied (:func:`training.launch.rdzv_poll.apply_rdzv_poll`,
:func:`training.launch.spare_fixes.apply_spare_fixes`, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), against one
real ``python -m training.rdzv_store`` process. Agents are threads of this process (128 processes would not fit
two cores); no worker and no training runs.

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

Also measured: rendezvous store operations (state reads and compare-and-sets by the handlers) per second, the
size of the pickled rendezvous state, the latency of a ``get`` timed by a separate probe process every 20 ms,
and the lag of this process's own threads (a 10 ms sleep that overshoots means the simulation, not the store,
was slow: the GIL and two shared cores).

Usage::

    python -m chaos.rdzv_scale --nodes 8,32,128        # one run per N, then a table
    python -m chaos.rdzv_scale --nodes 4 --json out.json

What it cannot show: network latency and bandwidth between nodes and the store (all loopback here), agent start
skew across real nodes (all agents start together: the worst burst), the store's behaviour on a loaded head node,
worker start and process-group set-up after the rendezvous, and anything the GIL hides: with 128 agents in one
interpreter, a slow round may be this process rather than the store (see the lag column).
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
    error: str = ""

    @property
    def ok(self) -> bool:
        return (self.reformed_world == self.nodes - 1 and self.reformed_ranks == list(range(self.nodes - 1))
                and not self.victim_in_new_round)


class _Counter:
    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.n += 1


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

    def __init__(self, idx: int, params, start: threading.Barrier, go: threading.Event, ops: _Counter) -> None:
        super().__init__(name=f"sim-agent-{idx}", daemon=True)
        self.idx, self.params, self.start_barrier, self.ops = idx, params, start, ops
        self.go = go                      # set by the driver to start round 1
        self.failed = threading.Event()   # survivors: "my workers failed" -> next rendezvous
        self.die = threading.Event()      # the victim: stop everything, as SIGKILL would
        self.done = threading.Event()     # driver: the run is over, leave
        self.handler = None
        self.rounds: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def _count_store_ops(self) -> None:
        backend = self.handler._state_holder._backend
        call = backend._call_store

        def counted(*a, **kw):
            self.ops.add()
            return call(*a, **kw)

        backend._call_store = counted

    def _round(self) -> None:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

        t0 = time.monotonic()
        info = self.handler.next_rendezvous()
        spec = WorkerSpec(role="default", local_world_size=1, rdzv_handler=self.handler, entrypoint="sim")
        # torchrun's own rank assignment (rank 0 gathers every agent's role info from the store); it uses no
        # agent state, so it runs unbound here
        workers = SimpleElasticAgent._assign_worker_ranks(None, info.store, info.rank, info.world_size, spec)
        self.rounds.append({"start": t0, "ranked": time.monotonic(), "rank": info.rank, "world": info.world_size,
                            "global_rank": workers[0].global_rank, "round": self.handler._state_holder.state.round})

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


def _wait_until(cond, timeout_s: float, what: str, agents: list[SimAgent]) -> float:
    deadline = time.monotonic() + timeout_s
    while not cond():
        errors = [a.error for a in agents if a.error is not None]
        if errors:
            raise RuntimeError(f"a simulated agent failed while waiting for {what}: {errors[0]!r}") from errors[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.005)
    return time.monotonic()


def simulate(nodes: int, *, tuning: RdzvTuning = RdzvTuning(), steady_s: float = 2.0, timeout_s: float = 120.0,
             probe: bool = True, say=print) -> ScaleResult:
    """Run the two rounds at ``nodes`` agents against a fresh store process; see the module docstring."""
    if nodes < 2:
        raise ValueError(f"--nodes {nodes}: need at least 2 (one dies, MIN = N-1 re-form)")
    import torch.distributed as dist

    from training.launch.local import start_store

    patches = agent_patches(nodes)
    poll = patches.__enter__()  # left in the finally below, once no simulated agent runs
    workdir = tempfile.mkdtemp(prefix="t5-rdzv-scale-")
    store_proc, port = start_store(workdir, die_with_us=True)
    endpoint = f"127.0.0.1:{port}"
    run_id = f"scale-{nodes}-{os.getpid()}"
    cfg = LaunchConfig(min_nodes=nodes - 1, max_nodes=nodes, rdzv_endpoint=endpoint, rdzv_id=run_id,
                       external_store=True, tuning=tuning)
    probe_file = os.path.join(workdir, "probe.txt")
    probe_proc = _start_probe(endpoint, probe_file) if probe else None
    lag: list[float] = []
    stop_lag = threading.Event()
    agents: list[SimAgent] = []
    try:
        params = rendezvous_parameters(cfg)
        observer = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        ops = _Counter()
        barrier, go = threading.Barrier(nodes + 1), threading.Event()
        agents = [SimAgent(i, params, barrier, go, ops) for i in range(nodes)]
        for a in agents:
            a.start()
        barrier.wait(timeout=timeout_s)  # every handler connected: only the rendezvous is timed
        threading.Thread(target=_lag_monitor, args=(stop_lag, lag), daemon=True).start()
        say(f"[rdzv-scale] N={nodes}: {nodes} handlers connected to {endpoint} ({rdzv_conf(cfg)}, poll {poll:g} s)")

        ops0, t_go, w_go = ops.n, time.monotonic(), time.time()
        go.set()
        try:
            t_first = _wait_until(lambda: all(a.rounds for a in agents), timeout_s, "the first round", agents)
        except (RuntimeError, TimeoutError) as e:
            done = sum(1 for a in agents if a.rounds)
            return ScaleResult(nodes=nodes, poll_s=poll, lag_ms_max=1000 * max(lag, default=0.0),
                               store_ops_per_s_first=(ops.n - ops0) / (time.monotonic() - t_go),
                               error=f"first round: {done}/{nodes} agents ranked after "
                                     f"{time.monotonic() - t_go:.0f} s; {e}")
        first_s, ops_first = t_first - t_go, ops.n - ops0
        lag_first = max(lag, default=0.0)
        state, state_bytes = _state(observer, run_id)
        say(f"[rdzv-scale] N={nodes}: first round {first_s:.2f} s, {len(state.participants)} participants")

        ops1 = ops.n
        time.sleep(steady_s)  # healthy agents polling num_nodes_waiting
        ops_steady = (ops.n - ops1) / steady_s

        victim = next(a for a in agents if a.rounds[0]["rank"] == 0)
        dead_node = victim.handler._this_node
        ops2, t_kill, w_kill = ops.n, time.monotonic(), time.time()
        victim.die.set()
        for a in agents:
            if a is not victim:
                a.failed.set()
        survivors = [a for a in agents if a is not victim]

        def dropped() -> bool:
            st, _ = _state(observer, run_id)
            return st is not None and dead_node not in st.participants and dead_node not in st.last_heartbeats

        try:
            t_dropped = _wait_until(dropped, timeout_s, "the dead node's removal", agents)
            t_reformed = _wait_until(lambda: all(len(a.rounds) == 2 for a in survivors), timeout_s,
                                     "the re-formed round", agents)
        except (RuntimeError, TimeoutError) as e:
            return ScaleResult(nodes=nodes, poll_s=poll, first_round_s=first_s, state_kb=state_bytes / 1024,
                               store_ops_per_s_first=ops_first / first_s, store_ops_per_s_steady=ops_steady,
                               lag_ms_max=1000 * max(lag, default=0.0), error=f"re-forming: {e}")
        ops_reform = (ops.n - ops2) / (t_reformed - t_kill)
        new_state, new_bytes = _state(observer, run_id)
        ranks = sorted(a.rounds[1]["global_rank"] for a in survivors)
        worlds = {a.rounds[1]["world"] for a in survivors}
        w_end = time.time()
        for a in agents:
            a.done.set()
        for a in survivors:
            a.join(timeout=30)
        say(f"[rdzv-scale] N={nodes}: dead node dropped after {t_dropped - t_kill:.2f} s, re-formed with "
            f"{len(new_state.participants)} after {t_reformed - t_kill:.2f} s")
        lat = _read_probe(probe_file, probe_proc, w_go, w_end) if probe_proc else []
        return ScaleResult(
            nodes=nodes, poll_s=poll, first_round_s=first_s, reform_dropped_s=t_dropped - t_kill,
            reform_s=t_reformed - t_kill, reformed_world=worlds.pop() if len(worlds) == 1 else -1,
            reformed_ranks=ranks, victim_in_new_round=dead_node in new_state.participants,
            state_kb=max(state_bytes, new_bytes) / 1024,
            store_ops_per_s_first=ops_first / first_s, store_ops_per_s_steady=ops_steady,
            store_ops_per_s_reform=ops_reform,
            probe_ms_p50=1000 * statistics.median(lat) if lat else float("nan"),
            probe_ms_max=1000 * max(lat) if lat else float("nan"),
            lag_ms_max=1000 * max(lag_first, max(lag, default=0.0)))
    finally:
        stop_lag.set()
        for a in agents:
            a.done.set()
        _join_all(agents, 5)  # survivors shut their handlers down (the store must still be there)
        if probe_proc is not None and probe_proc.poll() is None:
            probe_proc.terminate()
            probe_proc.wait(timeout=30)
        store_proc.terminate()
        store_proc.wait(timeout=30)
        _join_all(agents, 10)  # threads stuck in a failed round end once the store is gone
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


COLUMNS = [("N", "nodes", "{:d}"), ("poll s", "poll_s", "{:.2f}"), ("first round s", "first_round_s", "{:.2f}"),
           ("dead dropped s", "reform_dropped_s", "{:.2f}"), ("re-formed s", "reform_s", "{:.2f}"),
           ("state KiB", "state_kb", "{:.1f}"), ("ops/s 1st", "store_ops_per_s_first", "{:.0f}"),
           ("ops/s steady", "store_ops_per_s_steady", "{:.0f}"), ("ops/s re-form", "store_ops_per_s_reform", "{:.0f}"),
           ("get p50 ms", "probe_ms_p50", "{:.2f}"), ("get max ms", "probe_ms_max", "{:.1f}"),
           ("sim lag max ms", "lag_ms_max", "{:.0f}"), ("N-1 ranks ok", "ok", "{}")]


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
    p.add_argument("--steady-s", type=float, default=2.0,
                   help="seconds of healthy polling between the rounds (measures steady store load; default 2)")
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up on a round after this (default 180)")
    p.add_argument("--no-probe", action="store_true", help="do not time store gets from a separate process")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--probe", help=argparse.SUPPRESS)  # internal: the probe process
    p.add_argument("--probe-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.probe:
        return _probe(a.probe, a.probe_out)
    import logging
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    t = RdzvTuning()
    print(f"[rdzv-scale] launcher tuning: last_call_timeout={t.last_call_timeout}s, keep-alive "
          f"{t.keep_alive_interval}s x {t.keep_alive_max_attempt}, poll = clamp(N/200, 0.1, 1.0) s: "
          + ", ".join(f"N={n}: {poll_s(n):g}" for n in a.nodes), flush=True)
    results = []
    for n in a.nodes:
        results.append(simulate(n, steady_s=a.steady_s, timeout_s=a.timeout_s, probe=not a.no_probe,
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

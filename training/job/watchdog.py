"""Peer heartbeat watchdog: a silent peer is found in seconds, not after a collective's timeout.

A killed process closes its sockets and its peers' collectives fail at once. A *silent* one does not: a node
that lost power or whose kernel hangs, a partitioned network, a stopped (SIGSTOP) or wedged worker. Its peers
then wait in their next collective for ``parallel.train_timeout_s`` (30-60 s on the platforms), and torchrun
waits another fixed 30 s for a stopped worker to exit. The watchdog cuts that short:

* every worker runs one daemon thread that publishes a counter (``hb/<rank>``) in the job's rendezvous store
  once a second; the thread beats while the main thread computes, waits in a collective or writes a
  checkpoint, so a slow step or a long save is never taken for silence;
* the same thread watches one peer, the next rank in a ring (``(rank + 1) % world``): every rank is watched
  by exactly one other, and the store sees O(world) reads a second, not O(world^2);
* a peer whose counter has not moved for ``parallel.heartbeat_timeout_s`` is declared silent: the watcher
  prints one line naming it (rank, node, pid) and ends its own worker. A store that does not answer is not a
  silent peer: the watcher says so once, pauses its verdicts and keeps beating its node's file (the store is
  rank 0's worker's; a lost node is the membership's to find, by its expired lease), and starts measuring afresh
  when the store answers again. Its agent restarts the group; the rendezvous drops the silent node after its missed
  keep-alives (about 3 s, ``training.launch``); the job resumes from the newest in-memory snapshot or
  checkpoint.

A stopped or wedged worker is also ended by its own node: the worker's thread touches a file in
``$T5F_HEARTBEAT_DIR`` at every beat, and :class:`NodeWatchdog`, a thread in the node's agent
(``training.launch.agent``), SIGKILLs a child worker whose file has not changed for its timeout. The agent then
sees a dead worker and restarts at once, instead of after torch's fixed 30 s wait for a stopped process.

The same thread also watches its own main thread (:mod:`training.job.progress`): each beat carries the step and
the phase the trainer last entered (:class:`training.job.progress.Heartbeat`, JSON), and a main thread that has
stayed in its phase past the phase's bound, outside any collective, is *wedged* (a hung read of the shared file
system, a call that never returns; the thread itself beats on, so silence would never show it). The thread
prints one line (rank, node, pid, phase, step, seconds stuck vs the bound), writes the verdict into its heartbeat
file and stops beating: the agent's :class:`NodeWatchdog` SIGKILLs the worker at its next look (a second), as it
does a stopped one, and the group restarts. (Why the agent and not the worker itself: the kill comes from outside
the stuck process, the same path as a stopped worker's, and a worker without an agent watching ends itself.)

A worker that ends normally publishes ``done`` first, so a peer that is still closing never mistakes it for
silence. Keys live under a prefix drawn at start-up (one collective), so every restart of the group starts
with fresh heartbeats. One process (``world`` 1) or ``heartbeat_timeout_s`` 0: :meth:`PeerWatchdog.build`
returns a watchdog that does nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Callable

from training.job.progress import Heartbeat, ProgressTracker, Stall

#: Seconds between two beats (and two looks at the watched peer).
BEAT_S = 1.0
DONE = "done"
#: Set by the agent for its workers: the node-local directory of their heartbeat files (see NodeWatchdog).
HEARTBEAT_DIR_ENV = "T5F_HEARTBEAT_DIR"
#: The last word of a heartbeat file whose worker declared itself wedged: its agent SIGKILLs it at once.
WEDGED = "wedged"
#: `<pid>.exit` in the heartbeat directory: the worker stopped with one of the training module's own exit codes.
FINAL_EXIT_SUFFIX = ".exit"
#: Created (exclusively) by whoever SIGTERMs the agent for a final exit, so the agent gets that signal once.
FINAL_EXIT_SIGNALLED = "final-exit.signalled"


def tell_agent_final_exit(code: int) -> None:
    """In a worker that stops with one of the training module's own exit codes (bad settings, another run's
    checkpoint, divergence, failing storage, a busy directory: a restart would stop the same way), tell its agent
    (:class:`NodeWatchdog`), which then ends the job with that code instead of restarting the group. No-op outside
    an agent of training.launch.agent.

    The worker SIGTERMs its agent itself, at once: torchrun's monitor loop looks at its workers every 0.1 s and
    would restart the group before the agent's NodeWatchdog (one look a second) read the note."""
    from training.job.lifecycle import AGENT_ENV

    beat_dir = os.environ.get(HEARTBEAT_DIR_ENV, "")
    if not beat_dir:
        return
    try:
        with open(os.path.join(beat_dir, f"{os.getpid()}{FINAL_EXIT_SUFFIX}"), "w") as f:
            f.write(f"{code}\n")
    except OSError:
        return  # the agent is gone with its directory: nothing will restart this worker either
    agent = os.environ.get(AGENT_ENV, "")
    if agent.isdigit() and _claim_final_exit_signal(beat_dir):
        try:
            os.kill(int(agent), signal.SIGTERM)
        except ProcessLookupError:
            pass


def _claim_final_exit_signal(beat_dir: str) -> bool:
    """True for the first caller on this node (a worker or the agent's watchdog): it sends the agent's SIGTERM.
    A second SIGTERM would interrupt the agent while it stops its workers."""
    try:
        os.close(os.open(os.path.join(beat_dir, FINAL_EXIT_SIGNALLED), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except OSError:
        return False


class PeerWatchdog:
    """Publishes this rank's heartbeat and ends this worker when the watched peer falls silent.

    wd = PeerWatchdog.build(cfg.parallel, rank=rank, world=world, on_silent=record)
    wd.start()
    ...             # training
    wd.close()      # after the last collective: peers stop watching this rank
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        rank: int,
        world: int,
        store=None,
        on_silent: Callable[[str], None] | None = None,
        exit_code: int = 1,
        exit_fn: Callable[[int], None] = os._exit,
        progress: ProgressTracker | None = None,
    ):
        self.enabled = timeout_s > 0 and world > 1 and store is not None
        self.timeout_s, self.rank, self.world = timeout_s, rank, world
        self.peer = (rank + 1) % world
        self.store = store
        self.on_silent = on_silent or (lambda line: None)
        self.exit_code = exit_code
        self.exit_fn = exit_fn  # os._exit: the main thread may be blocked in a collective that never returns
        self.progress = progress  # None: beats carry no progress and the main thread is not judged
        self.node = os.environ.get("GROUP_RANK", "0")  # the torchrun agent (node) this worker belongs to
        beat_dir = os.environ.get(HEARTBEAT_DIR_ENV, "")
        self.beat_file = os.path.join(beat_dir, str(os.getpid())) if beat_dir and self.enabled else ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def build(
        cls,
        cfg,
        *,
        rank: int,
        world: int,
        on_silent: Callable[[str], None] | None = None,
        progress: ProgressTracker | None = None,
    ) -> "PeerWatchdog":
        """From the parallel config slice (heartbeat_timeout_s); `progress`: the trainer's tracker, whose phases
        the beats carry and whose stalls end this worker. Collective when enabled: rank 0 draws the key prefix of
        this incarnation of the group and broadcasts it."""
        import torch.distributed as dist  # here: the agent imports this module for NodeWatchdog before torch

        if cfg.heartbeat_timeout_s <= 0 or world < 2 or not dist.is_initialized():
            return cls(timeout_s=0, rank=rank, world=world)
        token = [secrets.token_hex(6) if rank == 0 else None]
        dist.broadcast_object_list(token, src=0)
        from training.torch_private import default_store

        base = default_store()
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
        if not isinstance(base, dist.TCPStore):  # file:// or in-process groups (tests): nobody to watch over TCP
            return cls(timeout_s=0, rank=rank, world=world)
        # Its own connection: the thread never waits behind the main thread's store calls, and its calls time
        # out after the heartbeat timeout (a silent store host is silence too).
        client = dist.TCPStore(
            base.host, base.port, is_master=False, timeout=timedelta(seconds=cfg.heartbeat_timeout_s)
        )
        store = dist.PrefixStore(f"t5-failover/heartbeat/{token[0]}/", client)
        return cls(
            timeout_s=cfg.heartbeat_timeout_s,
            rank=rank,
            world=world,
            store=store,
            on_silent=on_silent,
            progress=progress,
        )

    def start(self) -> None:
        if not self.enabled:
            return
        self.store.set(
            f"who/{self.rank}", json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "node": self.node})
        )
        self._thread = threading.Thread(target=self._run, name="t5f-heartbeat", daemon=True)
        self._thread.start()

    def close(self, wait: bool = True) -> None:
        """Stop beating and tell the watcher this rank ended on purpose (best effort). ``wait=False`` (an in-place
        recovery, which must check in at once): the rest in a daemon thread, since the store is rank 0's worker's
        and a host that vanished with its link (a node lost on a real network) blocks its calls for the store's
        timeout; measured on the Slurm lab, a lost rank 0's node held a survivor here past its agent's grace."""
        if not self.enabled or self._thread is None:
            return
        self._stop.set()
        if wait:
            self._finish()
        else:
            threading.Thread(target=self._finish, name="t5f-heartbeat-close", daemon=True).start()

    def _finish(self) -> None:
        self._thread.join(timeout=2 * BEAT_S)
        if self.beat_file:
            try:
                os.unlink(self.beat_file)  # the agent stops watching this worker
            except OSError:
                pass
        try:
            self.store.set(f"hb/{self.rank}", DONE)
        except Exception:  # noqa: BLE001 - the store may be gone at shutdown; the watcher then ends too
            pass

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        beat, seen, since, watching, store_away = 0, None, time.monotonic(), True, False
        key = f"hb/{self.peer}"
        while not self._stop.wait(BEAT_S if beat else 0):
            beat += 1
            stall = self.progress.stall() if self.progress is not None else None
            if stall is not None:
                self._declare_wedged(stall, beat)
                return
            if _agent_gone():  # a worker must not outlive its agent, wherever the store lives (rank 0's worker
                # hosts it when each round has its own, TORCH_DISABLE_SHARE_RDZV_TCP_STORE: then it answers on)
                self._end(f"[watchdog] rank {self.rank}: this worker's agent is gone; ending this worker")
                return
            self._touch(beat)  # first: this node's agent must see the worker alive whatever the store does
            try:
                self.store.set(f"hb/{self.rank}", self._payload(beat))  # beats go on to the end: others watch it
                value = self.store.get(key).decode() if watching and self.store.check([key]) else None
            except Exception as e:  # noqa: BLE001 - the store does not answer: pause the verdicts, never end for it
                if _agent_gone():  # ...unless this worker's agent went with it: a worker outliving its agent ends
                    self._end(
                        f"[watchdog] rank {self.rank}: the workers' store does not answer and this worker's "
                        f"agent is gone; ending this worker"
                    )
                    return
                if not store_away and not self._stop.is_set():
                    print(
                        f"[watchdog] rank {self.rank}: the workers' store does not answer ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120] if str(e) else '-'}); peer verdicts paused, training goes on",
                        file=sys.stderr,
                        flush=True,
                    )
                store_away = True
                continue
            now = time.monotonic()
            if store_away:  # silence while the store was away is not the peer's: start measuring again
                print(
                    f"[watchdog] rank {self.rank}: the workers' store answers again; peer verdicts resumed",
                    file=sys.stderr,
                    flush=True,
                )
                store_away, seen, since = False, value, now
                continue
            if not watching:
                continue
            if value == DONE:
                watching = False  # the peer finished on purpose; nothing more to watch
            elif value != seen:
                seen, since = value, now
            elif now - since > self.timeout_s:
                self._declare(now - since)

    def _payload(self, beat: int) -> str:
        return (self.progress.beat(beat) if self.progress is not None else Heartbeat(beat, 0, "")).to_json()

    def _touch(self, beat: int, verdict: str = "") -> None:
        if self.beat_file:
            try:
                with open(self.beat_file, "w") as f:
                    f.write(f"{self.timeout_s} {self.rank} {beat}{' ' + verdict if verdict else ''}\n")
            except OSError:
                self.beat_file = ""  # the directory went away: the agent's watchdog is not there either

    def _declare_wedged(self, stall: Stall, beat: int) -> None:
        """One line, then the verdict in the heartbeat file (the agent SIGKILLs this worker) and no more beats;
        without an agent watching, this worker ends itself."""
        line = (
            f"[watchdog] rank {self.rank} (node {self.node}, pid {os.getpid()}) is wedged: no progress in phase "
            f"{stall.phase} of step {stall.step} for {stall.stuck_s:.1f} s (bound {stall.bound_s:.1f} s: "
            f"{stall.rule}); its agent SIGKILLs it so the job restarts"
        )
        if not self.beat_file:
            self._end(line)
            return
        print(line, file=sys.stderr, flush=True)
        try:
            self.on_silent(line)
        except Exception:  # noqa: BLE001 - the kill matters more than the record
            pass
        self._touch(beat, WEDGED)

    def _declare(self, silent_s: float) -> None:
        try:
            who = json.loads(self.store.get(f"who/{self.peer}"))
        except Exception:  # noqa: BLE001
            who = {}
        where = f"node {who.get('node', '?')}, host {who.get('host', '?')}, pid {who.get('pid', '?')}"
        self._end(
            f"[watchdog] rank {self.rank}: rank {self.peer} ({where}) has sent no heartbeat for "
            f"{silent_s:.1f} s (parallel.heartbeat_timeout_s {self.timeout_s:g}); ending this worker so the job "
            "re-forms without it"
        )

    def _end(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        try:
            self.on_silent(line)
        except Exception:  # noqa: BLE001 - the exit matters more than the record
            pass
        sys.stdout.flush()
        self.exit_fn(self.exit_code)


class NodeWatchdog:
    """A thread in a node's agent: SIGKILLs a child worker whose heartbeat file has not changed for the timeout
    the worker wrote into it (a stopped or wedged worker), so the agent restarts at once.

        wd = NodeWatchdog.start_for_workers()   # sets $T5F_HEARTBEAT_DIR for the workers it will start
        ...                                     # the torchrun agent runs
        wd.close()
    """

    def __init__(self, directory: str):
        self.dir = directory
        self.agent = os.getpid()
        self.final_exit: int | None = None  # a worker's own exit code (tell_agent_final_exit): the job ends with it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="t5f-node-watchdog", daemon=True)

    @classmethod
    def start_for_workers(cls) -> "NodeWatchdog":
        import tempfile

        wd = cls(tempfile.mkdtemp(prefix="t5f-heartbeat-"))
        os.environ[HEARTBEAT_DIR_ENV] = wd.dir
        wd._thread.start()
        return wd

    def close(self) -> None:
        import shutil

        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self.check()

    def check(self, now: float | None = None) -> list[int]:
        """One look at every heartbeat file; returns the pids SIGKILLed."""
        killed = []
        now = time.time() if now is None else now
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else []:
            path = os.path.join(self.dir, name)
            if name.endswith(FINAL_EXIT_SUFFIX):
                self._stop_on_final_exit(path)
                continue
            try:
                pid, age = int(name), now - os.stat(path).st_mtime
                with open(path) as f:
                    words = f.read().split()
                timeout_s, rank = float(words[0]), float(words[1])
                wedged = words[3:4] == [WEDGED]
            except (OSError, ValueError, IndexError):
                continue
            if not _is_worker_of(pid, self.agent):  # ended (or never ours): forget it
                _unlink(path)
                continue
            if age > timeout_s or wedged:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _unlink(path)
                killed.append(pid)
                why = (
                    "declared itself wedged (its line above)"
                    if wedged
                    else f"has sent no heartbeat for {age:.1f} s (parallel.heartbeat_timeout_s {timeout_s:g})"
                )
                print(
                    f"[agent] worker pid {pid} (rank {int(rank)}) {why}: SIGKILLed it so this node restarts at once",
                    file=sys.stderr,
                    flush=True,
                )
        return killed

    def _stop_on_final_exit(self, path: str) -> None:
        """A worker stopped with its own exit code: SIGTERM this agent (torchrun stops its workers and raises
        SignalException, which training.launch.agent turns into that code) instead of a restart."""
        try:
            with open(path) as f:
                code = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return
        if self.final_exit is None:
            self.final_exit = code
            if _claim_final_exit_signal(self.dir):  # the worker could not (no T5_AGENT_PID): tell the agent here
                os.kill(self.agent, signal.SIGTERM)

    def final_exit_code(self) -> int | None:
        """A worker's own exit code if one stopped with it (read now: the worker's SIGTERM may come before this
        watchdog's next look), else None."""
        for name in sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []:
            if name.endswith(FINAL_EXIT_SUFFIX) and self.final_exit is None:
                try:
                    with open(os.path.join(self.dir, name)) as f:
                        self.final_exit = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
        return self.final_exit

    def kill_all(self, reason: str, reap_timeout_s: float = 5.0) -> list[int]:
        """SIGKILL every worker of this agent that has a heartbeat file and wait until they are gone (they may be
        blocked in a collective that cannot finish, where SIGTERM would wait out the shutdown timeout)."""
        pids = []
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else []:
            if name.isdigit() and _is_worker_of(int(name), self.agent):
                try:
                    os.kill(int(name), signal.SIGKILL)
                    pids.append(int(name))
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + reap_timeout_s
        while any(_is_worker_of(p, self.agent) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        if pids:
            print(f"[agent] SIGKILLed worker pid(s) {', '.join(map(str, pids))}: {reason}", file=sys.stderr, flush=True)
        return pids


def _agent_gone() -> bool:
    """True when this worker's torchrun agent (``T5_AGENT_PID``, set by training.launch.agent) no longer runs."""
    from training.job.lifecycle import AGENT_ENV

    agent = os.environ.get(AGENT_ENV, "")
    return agent.isdigit() and _stat(int(agent))[0] in (None, "Z", "X")


def _is_worker_of(pid: int, agent: int) -> bool:
    """Whether `pid` is alive (not a zombie) and a child of `agent`, or a grandchild through the agent's
    forkserver (warm workers, :mod:`training.launch.warm_workers`) (Linux /proc)."""
    state, parent = _stat(pid)
    if state in (None, "Z", "X"):
        return False
    return parent == agent or (parent is not None and _stat(parent)[1] == agent)


def _stat(pid: int) -> tuple[str | None, int | None]:
    """(state letter, parent pid) of `pid`, or (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None, None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

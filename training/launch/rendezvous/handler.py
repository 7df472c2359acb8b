"""torchrun's rendezvous on etcd: ``--rdzv-backend=t5-etcd``, registered through torch's public handler registry.

Each agent holds an etcd lease (TTL = keep-alive interval x attempts, ``--rdzv-conf``) with its member key
under it, renewed by a thread of its own; one watch on the job's prefix tells every agent at once when a
member's lease expires or the round changes (no polling, and a keep-alive costs the same at any job size).
The round logic is :mod:`.rounds`. What torchrun gets:

* ``next_rendezvous()``: a place in a formed round (its rank, the number of nodes) and a c10d ``TCPStore``
  hosted by the round's rank-0 agent for torchrun's rank assignment, exit barrier and the workers' bootstrap
  address. Its host is a participant of the round, so losing it is losing a node of the round, which ends
  the round anyway: no process outside the round can end the job through it.
* ``num_nodes_waiting()``, which torchrun's monitor loop asks every ``--monitor-interval``: 1 when the round
  must re-form (a participant lost, or a newer round open), else 0. On a lost participant it first says so in
  one line and SIGKILLs this node's workers (:func:`set_on_lost`): they wait in a collective with the lost node
  and cannot finish. Answered from the watch's view, so it never waits for etcd.
* ``shutdown()`` (torchrun calls it when the job ends) closes the rendezvous: hot spares still standing by
  leave with :class:`RendezvousClosedError`, which the agent turns into "not needed" and exit 0.

While no etcd member answers, training goes on (no collective needs etcd); the keep-alive thread and the watch
say so once and reconnect; only a new round waits for the store, and says so. etcd renews every lease when a
new leader takes over, so an outage costs no agent its membership.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Callable

from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousError, RendezvousHandler,
                                                        RendezvousInfo, RendezvousStoreInfo, RendezvousTimeoutError)

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, KeyValue, StoreUnavailable

BACKEND = "t5-etcd"
#: Seconds the round's store host waits at the end for the other agents to leave torchrun's exit barrier.
EXIT_WAIT_S = 10.0
_on_lost: list[Callable[[str], None]] = []


def set_on_lost(callback: Callable[[str], None]) -> None:
    """What this process does to its workers when a node of its round is lost (the agent: SIGKILL them)."""
    _on_lost[:] = [callback]


def _say(line: str) -> None:
    print(f"[rendezvous] {line}", file=sys.stderr, flush=True)


class StoreView:
    """The job's keys as the watch last delivered them; ``changed`` is notified on every change."""

    def __init__(self, client: EtcdClient, prefix: str):
        self.client, self.prefix = client, prefix
        self.keys: dict[str, KeyValue] = {}
        self.changed = threading.Condition()
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="t5f-rdzv-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def members(self) -> set[str]:
        with self.changed:
            return {k.rsplit("/", 1)[1] for k in self.keys if k.startswith(self.prefix + "members/")}

    def get(self, suffix: str) -> KeyValue | None:
        with self.changed:
            return self.keys.get(self.prefix + suffix)

    def wait(self, timeout_s: float) -> None:
        with self.changed:
            self.changed.wait(timeout_s)

    def _apply(self, kind: str, kv: KeyValue) -> None:
        with self.changed:
            if kind == "DELETE":
                self.keys.pop(kv.key, None)
            else:
                self.keys[kv.key] = kv
            self.changed.notify_all()

    def _run(self) -> None:
        said = False
        while not self._stop.is_set():
            try:  # resync: a broken or idle stream may have missed events
                kvs, rev = self.client.get_prefix(self.prefix)
            except Exception as e:  # noqa: BLE001 - no member answers: say so once, keep trying
                with self.changed:
                    self.connected = False
                if not said:
                    _say(f"membership store unreachable ({type(e).__name__}: {str(e)[:160]}); training goes on, "
                         f"retrying")
                    said = True
                self._stop.wait(0.2)
                continue
            with self.changed:
                self.keys = {kv.key: kv for kv in kvs}
                self.connected = True
                self.changed.notify_all()
            if said:
                _say("the membership store answers again")
                said = False
            try:
                self.client.watch(self.prefix, rev + 1, self._apply, self._stop)
            except Exception:  # noqa: BLE001 - the member went, or the stream idled out: resync and watch again
                pass


class EtcdRendezvousHandler(RendezvousHandler):
    """See the module docstring. Built by :func:`create_handler` from torchrun's rendezvous parameters."""

    def __init__(self, run_id: str, client: EtcdClient, *, min_nodes: int, max_nodes: int, ttl_s: int,
                 last_call_s: float, join_timeout_s: float, local_addr: str | None = None):
        self.run_id = run_id
        self.client = client
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.ttl_s, self.last_call_s, self.join_timeout_s = ttl_s, last_call_s, join_timeout_s
        self.addr = local_addr or socket.getfqdn()
        self.me = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.prefix = client.key(f"rdzv/{run_id}/")
        self.view = StoreView(client, self.prefix)
        self.round: rounds.Round | None = None  # the formed round this agent trains in
        self._lost_said = False
        self._store = None  # the round's TCPStore when this agent hosts it
        self._stop = threading.Event()
        self._lease = 0
        self._answering_since = time.monotonic()  # the store has answered every keep-alive since (None: it does not)
        self._join_store()
        self.view.start()
        threading.Thread(target=self._keep_alive, name="t5f-rdzv-lease", daemon=True).start()

    # ------------------------------------------------------------------ membership
    def _join_store(self) -> None:
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            try:
                self._lease = self.client.grant(self.ttl_s)
                self.client.put(self.prefix + f"members/{self.me}",
                                json.dumps({"addr": self.addr, "pid": os.getpid()}), lease=self._lease)
                return
            except StoreUnavailable as e:
                if time.monotonic() > deadline:
                    raise
                _say(f"waiting for the membership store: {e}")
                time.sleep(1)

    def _keep_alive(self) -> None:
        said = False
        while not self._stop.wait(max(0.2, self.ttl_s / 3)):
            try:
                if self.client.keep_alive(self._lease) == 0:  # expired (an outage, or the others saw it as lost)
                    _say(f"this node's membership lease expired; joining again as {self.me}")
                    self._join_store()
                if self._answering_since is None:
                    self._answering_since = time.monotonic()
                    _say("membership store answers again: keep-alives resumed")
                said = False
            except StoreUnavailable:
                self._answering_since = None
                if not said:
                    _say("membership store unreachable: keep-alives paused, training goes on")
                    said = True
            except Exception as e:  # noqa: BLE001 - never end the agent from this thread
                _say(f"keep-alive failed: {type(e).__name__}: {e}")

    def _settled(self) -> bool:
        """Whether the store has answered this agent for longer than a lease: only then is a missing member key
        a lost node. Right after an outage every lease may have run out (a store that was stopped, not
        restarted, expires them on waking), and each agent needs a keep-alive to join again."""
        since = self._answering_since
        return since is not None and time.monotonic() - since > self.ttl_s + 1

    # ------------------------------------------------------------------ torch's RendezvousHandler
    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return False

    def get_run_id(self) -> str:
        return self.run_id

    def is_closed(self) -> bool:
        return self.view.get("closed") is not None

    def set_closed(self) -> None:
        self.client.put(self.prefix + "closed", "1")

    def num_nodes_waiting(self) -> int:
        r = self.round
        if r is None or not self.view.connected:
            return 0
        lost = rounds.lost_participants(r, self.view.members())
        if lost and self._settled():  # first: a spare may already have opened the next round for it
            if not self._lost_said:
                self._lost_said = True
                _say(f"lost node(s) of round {r.n}: {', '.join(lost)} (membership lease expired, TTL {self.ttl_s} s): "
                     f"re-forming now; this node's workers are SIGKILLed, as their collectives with the lost node "
                     f"cannot finish")
                for callback in _on_lost:
                    callback(", ".join(lost))
            return 1
        current = self.view.get("round")
        return 1 if current is not None and rounds.Round.loads(current.value).n > r.n else 0

    def shutdown(self) -> bool:
        """Close the rendezvous (the job ended). The agent that hosts the round's store keeps it up until the
        others have left torchrun's exit barrier (each says so before closing), at most ``EXIT_WAIT_S``."""
        try:
            if self.round is not None:
                self.client.put(self.prefix + f"left/{self.round.n}/{self.me}", "1", lease=self._lease)
            self.set_closed()
            if self._store is not None and self.round is not None:
                deadline = time.monotonic() + EXIT_WAIT_S
                while time.monotonic() < deadline:
                    live = self.view.members()
                    gone = {p for p in self.round.participants if p not in live
                            or self.view.get(f"left/{self.round.n}/{p}") is not None}
                    if gone >= set(self.round.participants):
                        break
                    self.view.wait(0.2)
            self.client.revoke(self._lease)
        except Exception:  # noqa: BLE001 - best effort: the lease expires by itself
            pass
        self._stop.set()
        self.view.stop()
        return True

    def next_rendezvous(self):
        last = self.round.n if self.round else -1
        deadline = time.monotonic() + self.join_timeout_s
        waited_for_store = False
        while True:
            if self.is_closed():
                raise RendezvousClosedError(f"the rendezvous of {self.run_id} is closed (the job ended)")
            try:
                kv = self.client.get(self.prefix + "round")
                live = self._live()
            except StoreUnavailable as e:
                if not waited_for_store:
                    _say(f"a new round waits for the membership store ({e})")
                    waited_for_store = True
                time.sleep(0.2)
                continue
            r = rounds.Round.loads(kv.value) if kv else None
            step = rounds.next_step(self.me, last, r, live, min_nodes=self.min_nodes, max_nodes=self.max_nodes,
                                    now=time.time(), last_call_s=self.last_call_s)
            if step is rounds.Step.DONE:
                break
            if (step is rounds.Step.NEW_ROUND and r is not None and r.n > last
                    and rounds.lost_participants(r, live) and not self._settled()):
                step = rounds.Step.STAND_BY  # a member key missing right after an outage: give it time to return
            if step in (rounds.Step.WAIT, rounds.Step.STAND_BY):
                if step is rounds.Step.WAIT and time.monotonic() > deadline:
                    raise RendezvousTimeoutError(
                        f"round of {self.run_id} did not reach {self.min_nodes} node(s) within "
                        f"{self.join_timeout_s:g} s (live members: {len(live)})")
                if step is rounds.Step.STAND_BY:
                    deadline = time.monotonic() + self.join_timeout_s
                self.view.wait(0.5)
                continue
            self._act(step, r, kv.mod_revision if kv else 0, live)
        self.round, self._lost_said = r, False
        rank = r.participants.index(self.me)
        store = self._round_store(r, rank)
        _say(f"round {r.n}: rank {rank} of {len(r.participants)} node(s)"
             + (f", {len(live) - len(r.participants)} standing by" if len(live) > len(r.participants) else ""))
        return RendezvousInfo(store, rank, len(r.participants),
                              RendezvousStoreInfo.build(rank, store, local_addr=self.addr))

    def _live(self) -> set[str]:
        kvs, _ = self.client.get_prefix(self.prefix + "members/")
        return {kv.key.rsplit("/", 1)[1] for kv in kvs}

    def _act(self, step, r: rounds.Round | None, revision: int, live: set[str]) -> None:
        if step is rounds.Step.NEW_ROUND:
            new = rounds.new_round(r, self.me)
        elif step is rounds.Step.JOIN:
            new = rounds.Round(**{**r.__dict__, "joined": r.joined + [self.me]})
        elif step is rounds.Step.MARK_MIN:
            new = rounds.Round(**{**r.__dict__, "min_at": time.time()})
        else:  # CLOSE
            new = rounds.Round(**{**r.__dict__, "formed": True,
                                  "participants": rounds.choose(r, live, self.max_nodes)})
        self.client.compare_and_set(self.prefix + "round", revision, new.dumps())  # lost the race: read again

    def _round_store(self, r: rounds.Round, rank: int):
        """The round's TCPStore: rank 0 hosts it and publishes its address; the others connect."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=max(30.0, self.join_timeout_s))
        key = self.prefix + f"store/{r.n}"
        if rank == 0:
            self._store = dist.TCPStore(self.addr, 0, is_master=True, timeout=timeout, wait_for_workers=False)
            self.client.put(key, f"{self.addr}:{self._store.port}", lease=self._lease)
            return self._store
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            kv = self.view.get(f"store/{r.n}")
            if kv is not None:
                host, _, port = kv.value.rpartition(":")
                return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
            if time.monotonic() > deadline or rounds.lost_participants(r, self.view.members()):
                raise RendezvousError(f"round {r.n}: its rank-0 node did not publish the round's store")
            self.view.wait(0.2)


def create_handler(params) -> EtcdRendezvousHandler:
    """torchrun's creator for ``--rdzv-backend=t5-etcd``: credentials from ``T5_ETCD_*`` (the launcher sets
    them), timings from ``--rdzv-conf`` (keep_alive_interval x keep_alive_max_attempt = the lease TTL)."""
    creds = ClientCredentials.from_env()
    interval = float(params.get("keep_alive_interval", 1))
    attempts = int(params.get("keep_alive_max_attempt", 3))
    return EtcdRendezvousHandler(
        params.run_id, EtcdClient(creds), min_nodes=params.min_nodes, max_nodes=params.max_nodes,
        ttl_s=max(1, round(interval * attempts)), last_call_s=float(params.get("last_call_timeout", 3)),
        join_timeout_s=float(params.get("join_timeout", 600)), local_addr=params.local_addr)


def register() -> None:
    """Make ``--rdzv-backend=t5-etcd`` known to torchrun in this process (torch's public registry)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    try:
        rendezvous_handler_registry.register(BACKEND, create_handler)
    except ValueError:
        pass  # already registered in this process

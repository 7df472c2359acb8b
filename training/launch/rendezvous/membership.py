"""This agent's membership of the job: its etcd lease and the member key under it.

The agent joins under a lease (TTL = keep-alive interval x attempts) with its member key ``members/<id>``, which
says what the closer needs of it (:func:`.layout.member_values`); a thread of its own renews the lease
(:meth:`Membership.keep_alive`) and joins again under a new one once the old one expired (an outage, or the
others saw this node as lost). It also keeps since when the store has answered without a break: a member key
missing right after an outage is not a lost node until the store has answered for a lease's time
(:meth:`Membership.settled`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

from training.launch.rendezvous.client import EtcdClient, StoreRefused, StoreUnavailable
from training.launch.rendezvous.layout import say


class Membership:
    """The lease (``lease``) and member key (created at ``member_rev``) of agent ``me`` under the job's
    ``prefix``; ``value`` is what its key holds. ``stop``: the agent is leaving (no renewal joins again then);
    ``on_rejoined``: called, under the membership's lock, after it joined again under a new lease."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        me: str,
        value: dict,
        *,
        ttl_s: int,
        join_timeout_s: float,
        stop: threading.Event,
        on_rejoined: Callable[[], None],
    ):
        self.client, self.me, self.key, self.value = client, me, prefix + f"members/{me}", value
        self.ttl_s, self.join_timeout_s = ttl_s, join_timeout_s
        self._stop, self._on_rejoined = stop, on_rejoined
        self.lease = 0
        self.member_rev = 0
        self.answering_since: float | None = time.monotonic()
        self._lock = threading.Lock()
        self._said_unreachable = False

    def join(self) -> None:
        with self._lock:
            self._join_locked()

    def _join_locked(self) -> None:
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            try:
                self.lease = self.client.grant(self.ttl_s)
                revision = self.client.put(self.key, json.dumps(self.value), lease=self.lease)
                kv = self.client.get(self.key)  # None if the lease ran out already (a slow store): the put's revision
                self.member_rev = kv.create_revision if kv else revision
                return
            except StoreUnavailable as e:
                if time.monotonic() > deadline:
                    raise
                say(f"waiting for the membership store: {e}")
                time.sleep(1)
            except StoreRefused as e:  # the new lease ran out before the put (a store or host slower than its TTL)
                if "lease not found" not in str(e) or time.monotonic() > deadline:
                    raise
                say(f"this node's new lease expired before its member key was written; joining again ({e})")

    def keep_alive(self) -> None:
        """The keep-alive thread: renew the lease until the agent stops."""
        while not self._stop.wait(max(0.2, self.ttl_s / 3)):  # two renewals may fail before the lease expires
            self.keep_alive_once()

    def keep_alive_once(self) -> None:
        """Renew the lease once; if it expired, join again under a new one. Never raises (says what failed)."""
        try:
            if self.client.keep_alive(self.lease) == 0:  # expired (an outage, or the others saw it as lost)
                self.renew(self.lease)
            if self.answering_since is None:
                self.answering_since = time.monotonic()
                say("membership store answers again: keep-alives resumed")
            self._said_unreachable = False
        except StoreUnavailable:
            self.answering_since = None
            if not self._said_unreachable:
                say("membership store unreachable: keep-alives paused, training goes on")
                self._said_unreachable = True
        except Exception as e:  # noqa: BLE001 - never end the agent from this thread
            say(f"keep-alive failed: {type(e).__name__}: {e}")

    def renew(self, expired: int) -> None:
        """Join again under a new lease after ``expired`` ran out (once, whichever thread finds it first)."""
        with self._lock:
            if self.lease == expired and not self._stop.is_set():  # not once the agent is leaving
                say(f"this node's membership lease expired; joining again as {self.me}")
                self._join_locked()
                self._on_rejoined()

    def answering_since_wall(self) -> float:
        """Since when (wall clock) the store has answered this agent without a break (+inf: it does not now).
        An outage expires the leases, and with them the participants' confirmations of their places: each
        confirms again when it joins again, and :func:`.rounds.unconfirmed` gives it the whole window from here."""
        since = self.answering_since
        return float("inf") if since is None else time.time() - (time.monotonic() - since)

    def settled(self) -> bool:
        """Whether the store has answered this agent for longer than a lease: only then is a missing member key
        a lost node (see the module docstring)."""
        since = self.answering_since
        return since is not None and time.monotonic() - since > self.ttl_s + 1

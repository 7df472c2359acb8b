"""This agent's own writes on its way to a place in a round (torch's join operation, in small pieces).

Its join of an open round (:meth:`Joining.join`), taking it back when its join timed out
(:meth:`Joining.withdraw`), confirming its place in a round formed without its join (:meth:`Joining.confirm`),
and opening the next round when :func:`.rounds.agent_step` says so (:meth:`Joining.open_next_round`).
"""

from __future__ import annotations

import threading
from typing import Callable

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient, StoreRefused, StoreUnavailable
from training.launch.rendezvous.head_view import HeadView
from training.launch.rendezvous.layout import put_round, say
from training.launch.rendezvous.membership import Membership


class Joining:
    """Agent ``me``'s writes in the job under ``prefix``, under its ``membership``'s lease. ``stop``: the agent is
    leaving; ``start(target, name)`` starts a thread the handler's ``shutdown()`` waits for."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        me: str,
        membership: Membership,
        head: HeadView,
        stop: threading.Event,
        start: Callable[[Callable[[], None], str], None],
    ):
        self.client, self.prefix, self.me = client, prefix, me
        self._membership, self._head, self._stop, self._start = membership, head, stop, start

    def join(self, n: int, lease: int) -> None:
        """Put this agent's joined key for open round ``n`` under ``lease``."""
        self.client.put(self.prefix + f"joined/{n}/{self.me}", "", lease=lease)

    def withdraw(self, n: int) -> bool:
        """Take this agent's join of open round ``n`` back (its join timed out): its joined key deleted, then
        the round record rewritten as it is, so a close the closer computed while the key was there fails its
        compare-and-set (a round formed with a node that gave up waits for it: the others' workers never get
        rank 0's address). True if round ``n`` was formed with this agent first: it takes its place after all."""
        try:
            self.client.delete(self.prefix + f"joined/{n}/{self.me}")
            while True:
                kv = self.client.get(self.prefix + "round")
                r = rounds.Round.loads(kv.value) if kv else None
                if r is None or r.n != n or r.closed:
                    return False
                if r.formed:
                    return self.me in r.participants
                if self._put_round(kv.mod_revision, r):
                    return False
        except (StoreUnavailable, StoreRefused) as e:  # its key goes with its lease when the agent ends
            say(f"could not take back this node's join of round {n} after its timeout ({e})")
            return False

    def confirm(self, n: int) -> None:
        """Put this agent's joined key for formed round ``n`` (under its lease): it came, it is not stuck (a round
        the closer formed without joins, :func:`.rounds.reformed`; again after its lease expired, which took the
        key with it). In a thread of its own: the agent's workers need not wait for it, and N-1 agents' writes
        at once are not on the re-formation's path. Tries until it is written or the round is replaced."""

        def put() -> None:
            while not self._stop.is_set():
                head, _ = self._head.current()
                if head is not None and head.n != n:
                    return
                try:
                    self.client.put(self.prefix + f"joined/{n}/{self.me}", "", lease=self._membership.lease)
                    return
                except Exception:  # noqa: BLE001 - no member answers, or the lease expired and the keep-alive
                    self._stop.wait(0.5)  # thread is joining again under a new one (which confirms again)

        self._start(put, "t5f-rdzv-confirm")  # one a round at most: the handler's list of threads stays short

    def open_next_round(self, r: rounds.Round | None, revision: int) -> None:
        """Replace round ``r`` (the head's view of it, at ``revision``; None: no round yet) with the next, open
        one, unless another agent or the closer changed it first. The next round's ``prev`` is a formed round's
        participants (their old ranks), so a formed round is read whole first."""
        if r is None or not r.formed:
            self._put_round(revision, rounds.next_round(r))
            return
        whole, whole_revision = self._read_whole(r)
        if whole is not None:
            self._put_round(whole_revision, rounds.next_round(whole))

    def _read_whole(self, r: rounds.Round) -> tuple[rounds.Round | None, int]:
        """Formed round ``r`` read whole from the store (with its member lists) and its mod revision, or (None, 0)
        if the record is another round by now."""
        kv = self.client.get(self.prefix + "round")
        whole = rounds.Round.loads(kv.value) if kv else None
        if whole is None or whole.n != r.n or not whole.formed or whole.closed:
            return None, 0
        return whole, kv.mod_revision

    def _put_round(self, revision: int, new: rounds.Round, seats: bool = False) -> bool:
        """Compare-and-set the round record (``revision``: its mod revision now; 0: none yet) and its head;
        ``seats``: also the round's seat pages (it is being formed), older rounds' pages deleted."""
        return put_round(self.client, self.prefix, revision, new, seats)

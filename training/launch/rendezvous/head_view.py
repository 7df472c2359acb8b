"""The round's head as this agent watches it: the round record without its member lists, and this agent's seat.

Every agent watches the one key ``head`` (:class:`.watched.Watched`, thread ``t5f-rdzv-round``), so it hears of
a new round at once, and any job size costs each agent the same; it reads its page of a formed round's seats
(~2 KiB), not the whole record, and only when the head's changes do not say where its seat is.
"""

from __future__ import annotations

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient
from training.launch.rendezvous.layout import seats_key
from training.launch.rendezvous.watched import Watched


class HeadView:
    """The head of the job under ``prefix`` as agent ``me``'s watch (``watch``) last delivered it."""

    def __init__(self, client: EtcdClient, prefix: str, me: str):
        self.client, self.prefix, self.me, self.key = client, prefix, me, prefix + "head"
        self._cache: tuple[int, rounds.Head | None] = (0, None)
        self.watch = Watched(client, self.key, "t5f-rdzv-round", single_key=True)

    def start(self) -> "HeadView":
        self.watch.start()
        return self

    def current(self) -> tuple[rounds.Head | None, int]:
        """The round's head as the watch last delivered it, and its mod revision (parsed once per change:
        torchrun's monitor loop asks ``num_nodes_waiting()`` every 0.1 s)."""
        kv = self.watch.get(self.key)
        if kv is None:
            return None, 0
        if self._cache[0] != kv.mod_revision:
            self._cache = (kv.mod_revision, rounds.Head.loads(kv.value))
        return self._cache[1], kv.mod_revision

    def wait_for_change(self, revision: int, timeout_s: float = 1.0) -> None:
        """Until the watched head is newer than ``revision``, at most ``timeout_s`` (woken by the watch, not by
        polling: hundreds of agents sharing a host's cores each polling 5 times a second was felt)."""
        self.watch.wait_for(lambda: self.current()[1] > revision, timeout_s)

    def read(self, seat: tuple[int, str, int] | None) -> tuple[rounds.Round | None, int, rounds.Seats | None]:
        """The round as its head says (without its member lists), the head's mod revision (the record's: both are
        written together), and for a formed round this agent's seat: from the head's changes when this agent had
        a place in the round they are relative to (``seat``: that round's number, this agent's id and rank in it;
        it kept its rank, or the head names its new one), else its page of the round's seats, read from the store.
        The head is as this agent's watch last delivered it (no read: N agents waiting on a round would otherwise
        each read it at every change); while the watch is not connected (the store away, or just started) it is
        read from the store. A head that is behind the store costs nothing wrong: a join for an old round is not
        counted by the closer, a compare-and-set on an old revision fails, and a round's seats are written once,
        when it is formed; the next change wakes the agent again."""
        while True:
            if self.watch.connected:
                head, revision = self.current()
            else:
                head_kv = self.client.get(self.key)
                head, revision = (rounds.Head.loads(head_kv.value), head_kv.mod_revision) if head_kv else (None, 0)
            if head is None:
                return None, 0, None
            if not head.formed or head.closed:
                return head.as_round(), revision, None
            seats = rounds.seat_from_head(head, self.me, seat)  # kept its place, or the head says where
            if seats is not None:
                return head.as_round(), revision, seats
            kv = self.client.get(seats_key(self.prefix, head.n, rounds.page_of(self.me, rounds.page_count(head.size))))
            if kv is not None:
                return head.as_round(), revision, rounds.Seats.loads(kv.value)
            self.wait_for_change(revision, 0.2)  # a newer round was formed since: let the watch catch up

"""The round's store: the ``TCPStore`` each agent serves from the start and the formed round's participants use.

Each agent serves one when it joins the job (its address goes into its member key); the closer names rank 0's
in the transaction that forms a round, and every participant, rank 0 included, connects to that round's key
prefix on it (:meth:`RoundStore.connect`): torchrun's rank assignment, its exit barrier and the workers'
bootstrap address (:meth:`RoundStore.info`) go through it.
"""

from __future__ import annotations

import datetime
import time
from typing import Callable

from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousStoreInfo

from training.launch.rendezvous import rounds

#: Seconds one try to connect to the round's store may take before the agent looks whether the round is still
#: the one it took a place in (its rank-0 node may have been lost since: then a new round is on its way).
STORE_CONNECT_TRY_S = 3.0
#: The least time a round's store waits for a key (torch's own store default): the store's timeout is this or the
#: rendezvous join timeout, whichever is longer. A participant whose rank-0 node never takes its place gives up
#: after it (:meth:`RoundStore.info`).
STORE_TIMEOUT_FLOOR_S = 30.0


class RoundChanged(Exception):
    """The round this agent was taking a place in was replaced (a participant lost meanwhile)."""


class RoundStore:
    """This agent's store server (``server``, for the rounds in which it has rank 0) and its connections to
    formed rounds' stores. ``current`` gives the round's head as the agent's watch last delivered it."""

    def __init__(self, addr: str, join_timeout_s: float, current: Callable[[], tuple[rounds.Head | None, int]]):
        self.addr, self.join_timeout_s = addr, join_timeout_s
        self._current = current
        self.server = self.serve()

    def serve(self):
        """This agent's ``TCPStore`` server, for the rounds in which it has rank 0 (see the module docstring)."""
        import torch.distributed as dist

        return dist.TCPStore(self.addr, 0, is_master=True, timeout=self.timeout(), wait_for_workers=False)

    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(STORE_TIMEOUT_FLOOR_S, self.join_timeout_s))

    def connect(self, r: rounds.Round):
        """Formed round ``r``'s store: its key prefix on the store of its rank-0 agent (named in the round), which
        every participant connects to, rank 0 included. Raises :class:`RoundChanged` if the round is replaced
        while that store does not answer (its node lost meanwhile)."""
        import torch.distributed as dist

        host, _, port = r.store.rpartition(":")
        if not host or not port.isdigit():
            raise RendezvousError(f"round {r.n} names no store of its rank-0 node ({r.store!r})")
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            try:
                store = dist.TCPStore(
                    host, int(port), is_master=False, timeout=datetime.timedelta(seconds=STORE_CONNECT_TRY_S)
                )
                store.set_timeout(self.timeout())
                # torch's own handler does the same: keys of earlier rounds on the same server are not this round's.
                # A round whose survivors' workers go on in place shares the prefix of the round they started in
                # (its in-place scope): their agents keep that store for torchrun's exit barrier with the spare's.
                return dist.PrefixStore(f"t5f/round/{r.in_place_scope}", store)
            except RuntimeError as e:  # torch's DistStoreError / DistNetworkError: not answering (yet)
                current, _ = self._current()
                if current is None or current.n != r.n or current.closed:
                    raise RoundChanged() from None
                if time.monotonic() > deadline:
                    raise RendezvousError(
                        f"round {r.n}: its rank-0 node's store {r.store} did not answer within "
                        f"{self.join_timeout_s:g} s ({e})"
                    ) from None

    def info(self, r: rounds.Round, rank: int, store) -> RendezvousStoreInfo:
        """The workers' bootstrap address, which rank 0 publishes in the round's store (torch's
        ``RendezvousStoreInfo.build``); a rank-0 node that never takes its place is a rendezvous error, not the
        raw ``DistStoreError`` torch's store raises after its timeout."""
        try:
            return RendezvousStoreInfo.build(rank, store, local_addr=self.addr)
        except RuntimeError as e:  # torch's DistStoreError: the key never came, or the store went away
            # Its rank-0 node may have left for a newer round (two lost nodes whose leases ended one after the
            # other: a round each, the second formed while this node read the first's store, which its rank 0
            # then closed): take a place in the newer round, as connect() does, not end this agent.
            current, _ = self._current()
            if current is None or current.n != r.n or current.closed:
                raise RoundChanged() from None
            raise RendezvousError(
                f"round {r.n}: its rank-0 node (store {r.store}) did not take its place within "
                f"{self.timeout().total_seconds():g} s (it gave up or is stuck); start "
                f"this node again to join a new round ({str(e).splitlines()[0]})"
            ) from None

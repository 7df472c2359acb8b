"""The in-process recovery's membership board (:class:`training.job.inplace.agreement.MembershipBoard`) on the
job's etcd, through the rendezvous' own client (the same user, prefix, TLS and failover as the agents').

Keys under the job's prefix and a scope (``inplace/<scope>/``: one per start of the job's workers, e.g. the
rendezvous round, so that the workers of a full restart, the fall-back, do not find the epochs of the group they
replace, whose members are gone and would never decide): ``epochs/<epoch, 10 digits>/in/<member>`` (each check-in),
``epochs/<epoch>/decision``, ``latest`` (a copy of the newest decision) and ``gone/<member>`` (a member's process
reported gone). A decision is one transaction: created only if absent (so every member reads the same one),
``latest`` written with it, and the keys of epochs older than the one before it deleted (the store holds two epochs
of a scope, however long it runs).
"""

from __future__ import annotations

from training.job.inplace.agreement import BoardUnavailable, CheckIn, Membership
from training.launch.rendezvous.client import EtcdClient, StoreRefused, StoreUnavailable
from training.launch.rendezvous.watched import Watched


#: The value of a ``gone/<member>`` key reported for a lost node's worker (an empty value: one process gone).
NODE_LOST = "node lost"


class EtcdBoard:
    """:class:`~training.job.inplace.agreement.MembershipBoard` over ``client`` (see the module docstring)."""

    def __init__(self, client: EtcdClient, scope: str = "0"):
        if not scope or "/" in scope:
            raise ValueError(f"scope {scope!r} must be non-empty without '/' (e.g. the rendezvous round, 3)")
        self.client = client
        self.root = client.key(f"inplace/{scope}/")

    def _epoch(self, epoch: int) -> str:
        return f"{self.root}epochs/{epoch:010d}/"  # zero-padded: older epochs sort first (deleted as a range)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except (StoreUnavailable, StoreRefused) as e:  # the agreement tries again until its bound, then says why
            raise BoardUnavailable(str(e)) from e

    def latest(self) -> Membership | None:
        kv = self._call(self.client.get, self.root + "latest")
        return Membership.loads(kv.value) if kv else None

    def check_in(self, epoch: int, entry: CheckIn) -> None:
        self._call(self.client.put, self._epoch(epoch) + "in/" + entry.member, entry.dumps())

    def check_ins(self, epoch: int) -> dict[str, CheckIn]:
        kvs, _ = self._call(self.client.get_prefix, self._epoch(epoch) + "in/")
        return {e.member: e for e in (CheckIn.loads(kv.value) for kv in kvs)}

    def decide(self, decision: Membership) -> Membership:
        key, value = self._epoch(decision.epoch) + "decision", decision.dumps()
        older = (self.root + "epochs/", self._epoch(max(decision.epoch - 1, 0)))
        latest = {self.root + "latest": value}
        if self._call(lambda: self.client.compare_and_set(key, 0, value, also=latest, drop=older)):
            return decision
        held = self.decision(decision.epoch)
        if held is None:  # a lost race reads the winner's; absent only if the store lost it: say so, try again
            raise BoardUnavailable(f"the decision of epoch {decision.epoch} was neither written nor found")
        return held

    def decision(self, epoch: int) -> Membership | None:
        kv = self._call(self.client.get, self._epoch(epoch) + "decision")
        return Membership.loads(kv.value) if kv else None

    def report_gone(self, member: str, *, node_lost: bool = False) -> None:
        """``node_lost``: its node was lost (reported by the spare that takes its ranks), not one process."""
        self._call(self.client.put, self.root + "gone/" + member, NODE_LOST if node_lost else "")

    def gone(self) -> set[str]:
        return set(self._gone())

    def lost_with_their_node(self) -> set[str]:
        """The members reported gone with their node (their peers may be blocked with them, not failed)."""
        return {m for m, why in self._gone().items() if why == NODE_LOST}

    def watch_gone(self, on_change) -> Watched:
        """A started watch of the ``gone/`` reports (one per process or node lost: rare), calling ``on_change()`` on
        its thread at each: what wakes an agent whose worker may be blocked by a lost node (InPlaceAgent). The caller
        stops it."""
        return Watched(self.client, self.root + "gone/", "t5f-inplace-gone", on_change=on_change).start()

    def _gone(self) -> dict[str, str]:
        kvs, _ = self._call(self.client.get_prefix, self.root + "gone/")
        return {kv.key.rpartition("/")[2]: kv.value for kv in kvs}


def board_from_env() -> EtcdBoard:
    """The job's board for a worker: the etcd credentials its agent put in the environment (``T5_ETCD_*``), scoped
    by the rendezvous round its agent noted (``training.checkpoint.generation``; ``0`` outside an etcd round), so
    the workers of a full restart never wait on the epochs of the group they replace; a round that replaced lost
    nodes around running survivors keeps their round's scope, so a spare's workers join their epoch."""
    from training.checkpoint import generation
    from training.launch.rendezvous.client import ClientCredentials

    gen = generation.read()
    return EtcdBoard(EtcdClient(ClientCredentials.from_env()), scope=str(gen.in_place_scope) if gen else "0")


def install() -> None:
    """Give this worker process the job's board for ``failover.in_place``
    (:func:`training.job.inplace.agreement.register_board`), as the commit fence's etcd side is installed
    (:func:`training.launch.rendezvous.fence.install`). Imports no torch: a cold worker installs it before its
    ``main()``, which reports whether torch was preloaded (a warm worker)."""
    from training.job.inplace.agreement import register_board

    register_board(board_from_env)

"""The closer: the oldest live member of the job, which opens, closes and re-forms its rounds.

Every agent runs :meth:`Closer.run` in a thread of its own: it waits until the member created just before its
own is gone (each agent watches one key, so an election costs the same at any job size), then, as the oldest
member, watches every key of the job and acts on each change as :func:`.rounds.closer_step` says: open the
first round, mark when MIN was reached, close a round (form it, with its seats), re-form a round a participant
of which is lost or stuck (:func:`.rounds.reformed`), and note the hot spares waiting and the nodes arriving.
It stops being the closer when its own member key is made again (after its lease expired: another member may
be older now) and elects again.
"""

from __future__ import annotations

import threading
import time

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient, KeyValue
from training.launch.rendezvous.layout import member_values, put_round
from training.launch.rendezvous.membership import Membership
from training.launch.rendezvous.watched import Watched


class Closer:
    """The closer role of agent ``me`` (its ``membership``) in the job under ``prefix``; ``stop``: the agent is
    leaving; ``threads_stop_s``: how long its watches' threads are waited for when it stops."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        me: str,
        membership: Membership,
        stop: threading.Event,
        *,
        min_nodes: int,
        max_nodes: int,
        last_call_s: float,
        threads_stop_s: float,
        in_place: bool = False,
    ):
        self.client, self.prefix, self.me, self.membership, self.stop = client, prefix, me, membership, stop
        self.min_nodes, self.max_nodes, self.last_call_s = min_nodes, max_nodes, last_call_s
        self.threads_stop_s = threads_stop_s
        self.in_place = in_place  # the job's workers recover in place: a lost node's round may keep its scope

    def run(self) -> None:
        """The closer thread: wait until this agent is the oldest live member, then close and reopen rounds
        (:meth:`_close`)."""
        while not self.stop.is_set():
            try:
                before = self.client.newest_before(self.prefix + "members/", self.membership.member_rev)
                if before is None:
                    self._close()
                else:  # wait until the member created just before this one is gone
                    self._wait_deleted(before.key)
            except Exception:  # noqa: BLE001 - the store went away: try again
                self.stop.wait(0.5)

    def _wait_deleted(self, key: str) -> None:
        watch = Watched(self.client, key, "t5f-rdzv-elect", single_key=True).start()
        try:
            while not self.stop.is_set():
                if watch.connected and watch.get(key) is None:
                    return
                watch.wait(1.0)
        finally:
            watch.stop(join_s=self.threads_stop_s)

    def _close(self) -> None:
        """The closer's loop: watch every key of the job and act on each change (and every 0.2 s for the last
        call), until this agent is no longer the oldest member (its own key was re-made) or it stops."""
        view = Watched(self.client, self.prefix, "t5f-rdzv-closer-view").start()
        my_key = self.prefix + f"members/{self.me}"
        try:
            while not self.stop.is_set():
                view.wait(0.2)
                if not view.connected:
                    continue
                mine = view.get(my_key)
                if mine is None:
                    continue  # expired (an outage): the keep-alive thread registers it again
                if mine.create_revision != self.membership.member_rev:
                    return  # registered again: another member may be older now; elect again
                self._step(view)
        finally:
            view.stop(join_s=self.threads_stop_s)

    def _seen(self, view: Watched) -> tuple[KeyValue | None, rounds.Round | None, dict[str, KeyValue], list[str]]:
        """The round record's key and the round in ``view``, the live members' keys by id, and the ids that
        joined the round, first joined first."""
        kv = view.get(self.prefix + "round")
        r = rounds.Round.loads(kv.value) if kv else None
        live = {k.key.rsplit("/", 1)[1]: k for k in view.under(self.prefix + "members/")}
        joined_kvs = sorted(view.under(self.prefix + f"joined/{r.n}/") if r else [], key=lambda k: k.create_revision)
        return kv, r, live, [k.key.rsplit("/", 1)[1] for k in joined_kvs]

    def _step(self, view: Watched) -> None:
        """Act once on what ``view`` holds, as :func:`.rounds.closer_step` says."""
        kv, r, live, joined = self._seen(view)
        step = rounds.closer_step(
            r,
            set(live),
            joined,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            now=time.time(),
            last_call_s=self.last_call_s,
            settled=self.membership.settled(),
            answering_since=self.membership.answering_since_wall(),
        )
        if step is rounds.Step.WAIT:
            return
        if step is rounds.Step.OPEN:
            self._put_round(0, rounds.next_round(None))
            return
        if step is rounds.Step.REOPEN:
            self._reform(kv.mod_revision, r, view, live, joined)
            return
        if step is rounds.Step.NOTE_SPARES:
            new = rounds.Round(**{**r.__dict__, "spares": rounds.waiting(r, set(live))})
        elif step is rounds.Step.NOTE_ARRIVING:
            new = rounds.Round(**{**r.__dict__, "arriving": rounds.arriving(r, set(live), joined, self.max_nodes)})
        elif step is rounds.Step.MARK_MIN:  # the late nodes' count with it: one write
            new = rounds.Round(
                **{
                    **r.__dict__,
                    "min_at": time.time(),
                    "arriving": rounds.arriving(r, set(live), joined, self.max_nodes),
                }
            )
        else:  # CLOSE
            values, standby, node_index = member_values(live)
            new = rounds.formed(r, rounds.choose(r, joined, set(live), standby, self.max_nodes, node_index), set(live))
            new.store = values[new.participants[0]].get("store", "")  # its rank 0's (see .round_store)
            return self._put_round(kv.mod_revision, new, seats=True)
        self._put_round(kv.mod_revision, new)

    def _reform(
        self, revision: int, r: rounds.Round, view: Watched, live: dict[str, KeyValue], joined: list[str]
    ) -> None:
        """Replace formed round ``r`` (at ``revision``), a participant of which is lost or stuck: by the next
        formed round at once (:func:`.rounds.reformed`), or by an open one when too few are left for MIN."""
        lost = rounds.lost_participants(r, set(live))
        stuck = rounds.unconfirmed(
            r,
            set(live),
            joined,
            now=time.time(),
            last_call_s=self.last_call_s,
            answering_since=self.membership.answering_since_wall(),
        )
        taken_out = {k.key.rsplit("/", 1)[1] for k in view.under(self.prefix + "taken-out/")}
        values, standby, node_index = member_values(live)
        oldest_first = sorted(live, key=lambda i: live[i].create_revision)
        new = rounds.reformed(
            r,
            oldest_first,
            lost=lost,
            stuck=stuck,
            taken_out=taken_out,
            standby=standby,
            node_index=node_index,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            now=time.time(),
            in_place=self.in_place,
        )
        if new is None:
            new = rounds.next_round(r, [*lost, *stuck], taken_out)
            new.stuck = stuck
            self._put_round(revision, new)
            return
        new.store = values[new.participants[0]].get("store", "")
        self._put_round(revision, new, seats=True)

    def _put_round(self, revision: int, new: rounds.Round, seats: bool = False) -> bool:
        return put_round(self.client, self.prefix, revision, new, seats)

"""A node of the running round stops its rendezvous keep-alives: restart at once, SIGKILLing the workers, and
form the next round as soon as every live node is in.

Every agent writes a keep-alive into the rendezvous state once per ``keep_alive_interval`` (1 s); torch drops
a node whose keep-alive is older than ``keep_alive_interval x keep_alive_max_attempt`` (3 s) from the state,
but only *uses* that at the next rendezvous. A running agent restarts only when its own workers fail or a
node waits to join. When a node dies with its link down (power loss, kernel panic, a crashed instance), the
survivors' workers get no connection reset: they wait in their next collective with it until the heartbeat
watchdog (``parallel.heartbeat_timeout_s``, 10 s) or the collective's timeout ends them. And when a hot spare
lets the agents restart earlier (~3 s), torch stops the workers with SIGTERM and waits for them: a worker
blocked in a collective does not run its signal handler, so the restart still waited for the watchdog (most
of a ~14 s node loss on the Slurm lab).

This module makes the keep-alive the detector. Each agent remembers the members of the round it trains in and
the newest keep-alive it saw from each; in the monitor loop (torch calls ``num_nodes_waiting()`` every
``--monitor-interval``, on a fresh copy of the state) a member that is gone from the state *and* whose last
keep-alive is older than the limit was dropped as dead (a member that leaves to re-join was heartbeating a
moment ago). The agent then prints one line naming it, restarts (a membership change: it does not use up
``--max-restarts``) and SIGKILLs its workers instead of SIGTERM-ing them: a step or a save that needs the lost
node can never finish, so there is nothing to wait for; the newest in-memory snapshot (at most the step in
flight lost) or checkpoint is restored. The agent's keep-alive comes from an idle thread in the agent, so a
slow step, a long save or a busy worker never looks like a lost node; a hung worker on a live node is still
the heartbeat watchdog's to find.

Knowing who is lost also shortens the next rendezvous. torch closes a round that has MIN nodes but not MAX only
after ``last_call_timeout`` (3 s), in case more nodes arrive. While an agent joins the round after the one it
trained in, the round is closed at once when every member of the old round that is not lost has joined and no
node waits for a place (wait list, or a hot spare on the redundancy list): the last call could only admit a node
that is not there yet, which joins later as any new node does. A member that left to re-join a moment ago is
waited for, as is everyone on the first rendezvous.

Nothing changes when a round closes normally (the job finished: the state is closed), or for an agent that
is not training (a hot spare waits in the rendezvous, where torch already drops dead nodes).
"""

from __future__ import annotations

import signal
import sys
from datetime import datetime, timedelta, timezone

_APPLIED = "_t5f_lost_nodes"
#: Seconds the agent waits for its SIGKILLed workers to be reaped (they cannot refuse; this only bounds it).
REAP_TIMEOUT_S = 5


class RoundWatch:
    """The members of the round this agent trains in and the newest keep-alive seen from each.

        watch = RoundWatch.of(state, expiry=timedelta(seconds=3))   # when the round formed
        lost = watch.lost(state, now)                               # each look at a fresh copy of the state
    """

    def __init__(self, last_seen: dict, expiry: timedelta):
        self.last_seen = dict(last_seen)
        self.expiry = expiry

    @classmethod
    def of(cls, state, *, expiry: timedelta, now: datetime | None = None) -> "RoundWatch":
        now = now or datetime.now(timezone.utc)
        return cls({n: state.last_heartbeats.get(n, now) for n in state.participants}, expiry)

    def lost(self, state, now: datetime | None = None) -> list[tuple[object, float]]:
        """Members dropped from ``state`` for missing keep-alives, each with the age of its last one (s)."""
        now = now or datetime.now(timezone.utc)
        if state.closed:  # the job ended: agents stop their keep-alives on the way out
            return []
        gone = []
        for node, seen in self.last_seen.items():
            beat = state.last_heartbeats.get(node)
            if beat is not None:
                self.last_seen[node] = max(seen, beat)
            elif node not in state.participants and now - seen > self.expiry:
                gone.append((node, (now - seen).total_seconds()))
        return gone

    def everyone_in(self, state, node, min_nodes: int, now: datetime | None = None) -> bool:
        """For ``node`` waiting in an open round of ``state``: every member of the last round that is not lost,
        and every node waiting for a place (wait and redundancy lists), has joined it, and it has MIN nodes.
        Waiting out the last call (``last_call_timeout``) could then only admit a node that is not there yet."""
        if state.complete or state.closed or state.deadline is None or node not in state.participants:
            return False
        if len(state.participants) < min_nodes or state.wait_list or state.redundancy_list:
            return False
        lost = {n for n, _ in self.lost(state, now)}
        return all(n in state.participants for n in self.last_seen if n not in lost)


def describe(node) -> str:
    """``host (agent pid N)`` for torch's node descriptor (``addr``, ``pid``, ``local_id``)."""
    addr, pid = getattr(node, "addr", None), getattr(node, "pid", None)
    return f"{addr} (agent pid {pid})" if addr is not None else str(node)


def apply_lost_node_restart() -> None:
    """Patch torch's rendezvous handler and local agent in this process (idempotent; apply after
    :func:`training.launch.spare_fixes.apply_spare_fixes`, whose ``num_nodes_waiting`` it wraps)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    if getattr(dr.DynamicRendezvousHandler.num_nodes_waiting, _APPLIED, False):
        return
    next_rendezvous = dr.DynamicRendezvousHandler.next_rendezvous
    waiting = dr.DynamicRendezvousHandler.num_nodes_waiting
    stop_workers = LocalElasticAgent._stop_workers
    join = dr._RendezvousJoinOp.__call__
    last_round: dict = {}  # node -> the RoundWatch of the round it trained in, while it joins the next

    def next_rendezvous_watched(self):
        last_round[self._this_node] = getattr(self, "_t5f_watch", None)
        try:
            info = next_rendezvous(self)
        finally:
            last_round.pop(self._this_node, None)
        s = self._settings
        watch = RoundWatch.of(self._state_holder.state, expiry=s.keep_alive_interval * s.keep_alive_max_attempt)
        # not itself: if its own keep-alives fail, the others declare it lost and its workers' collectives fail
        watch.last_seen.pop(self._this_node, None)
        self._t5f_watch = watch
        self._t5f_lost = []
        return info

    def waiting_or_lost(self) -> int:
        n = waiting(self)  # syncs the state (and drops dead nodes from this copy of it)
        watch = getattr(self, "_t5f_watch", None)
        if watch is None:
            return n
        lost = watch.lost(self._state_holder.state)
        if lost and not self._t5f_lost:
            self._t5f_lost = lost
            names = ", ".join(f"{describe(node)}, last keep-alive {age:.1f} s ago" for node, age in lost)
            print(f"[agent] lost node(s) of this round: {names} (limit {watch.expiry.total_seconds():g} s): "
                  f"restarting now; this node's workers are SIGKILLed, as their collectives with the lost node "
                  f"cannot finish", file=sys.stderr, flush=True)
        return max(n, 1) if self._t5f_lost else n

    def stop_workers_at_once_if_lost(self, worker_group, *args, **kwargs):
        if getattr(worker_group.spec.rdzv_handler, "_t5f_lost", None):
            self._shutdown(signal.SIGKILL, REAP_TIMEOUT_S)
            return None
        return stop_workers(self, worker_group, *args, **kwargs)

    def join_or_close_round(self, ctx, deadline):
        action = join(self, ctx, deadline)
        watch = last_round.get(ctx.node)
        if (action in (dr._Action.SYNC, dr._Action.KEEP_ALIVE) and watch is not None
                and watch.everyone_in(ctx.state, ctx.node, ctx.settings.min_nodes)):
            return dr._Action.MARK_RENDEZVOUS_COMPLETE
        return action

    for fn in (next_rendezvous_watched, waiting_or_lost, stop_workers_at_once_if_lost, join_or_close_round):
        setattr(fn, _APPLIED, True)
    dr._RendezvousJoinOp.__call__ = join_or_close_round
    dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous_watched
    dr.DynamicRendezvousHandler.num_nodes_waiting = waiting_or_lost
    LocalElasticAgent._stop_workers = stop_workers_at_once_if_lost

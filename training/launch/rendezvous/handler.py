"""torchrun's rendezvous on etcd: ``--rdzv-backend=t5-etcd``, registered through torch's public handler registry.

Each agent holds an etcd lease (TTL = keep-alive interval x attempts, ``--rdzv-conf``) with its member key
under it, renewed by a thread of its own, and watches one key, the round record's head (the record without its
member lists, :class:`.rounds.Head`), so every agent hears of a new round at once (no polling, and a keep-alive
or a round change costs each agent the same at any job size). One agent, the *closer* (the oldest live member;
each agent watches the member created just before it and takes over when that one goes), also watches the
member and joined keys: it opens the first round, closes rounds, and forms the next at once when a
participant's lease expires (:func:`.rounds.reformed`; the participants confirm their places afterwards). An
agent takes its place from its page of the formed round's seats (:class:`.rounds.Seats`, ~2 KiB at any job
size), not from the whole record (O(N)). The decisions are :mod:`.rounds`. What torchrun gets:

* ``next_rendezvous()``: a place in a formed round (its rank, the number of nodes) and a c10d store for
  torchrun's rank assignment, exit barrier and the workers' bootstrap address: the round's key prefix on the
  ``TCPStore`` that every agent starts when it joins the job and that the round's rank-0 agent serves. Its
  address is in each member key, and the closer writes rank 0's into the transaction that forms the round, so
  every agent connects as soon as it has its place (rank 0 publishing a store after the round formed was one
  more transaction and one more change for every agent to hear: ~1 s of a 1,024-node re-formation in the
  simulation). Its host is a participant of the round, so losing it is losing a node of the round, which ends
  the round anyway: no process outside the round can end the job through it.
* ``num_nodes_waiting()``, which torchrun's monitor loop asks every ``--monitor-interval``: when a newer
  round exists (a participant lost, a worker group failed, nodes waiting with room), the late nodes that joined
  it as torch counts them (the closer keeps the count in the head, :func:`.rounds.arriving`), at least 1; else
  0. When the newer
  round replaces lost nodes of this one, it first says so in one line and SIGKILLs this node's workers
  (:func:`set_on_lost`): they wait in a collective with the lost node and cannot finish. Answered from the
  watch's view, so it never waits for etcd. In a ``failover.in_place`` job (``--rdzv-conf in_place=1``) a
  round that replaces lost nodes around this node's running workers (:func:`.rounds.keeps_workers`: its in-place
  scope is this round's) is taken over in place instead: this agent takes its place in it (the same seat and
  store prefix, its workers' generation noted, its place confirmed), says so, kills nothing and answers 0; its
  workers recover in place with the spares' workers (docs/inprocess.md, "A lost node").
* ``shutdown()`` (torchrun calls it when the job ends) closes the rendezvous: hot spares still standing by
  leave with :class:`RendezvousClosedError`, which the agent turns into "not needed" and exit 0; a participant
  re-forming its worker group in the job's newest round gets :class:`JobStoppedByAnotherNode` (the job failed
  elsewhere: exit 1, :func:`.rounds.ended_in_my_round`). While no etcd
  member answers it keeps trying for :data:`CLOSE_WAIT_S`; if it could not close it says so in one line and
  returns False (torch's contract), as an open rendezvous would give a waiting spare the ended job's place.
* the round an agent takes a place in is its workers' generation: noted for them (:mod:`training.checkpoint.generation`)
  before torchrun starts them, so rank 0's commit fence (:mod:`training.checkpoint.fence`) can ask etcd whether
  that round is still the newest before each checkpoint commits (a group whose agent lost the store while spares
  formed a newer round is stopped at its next commit).
* a node whose workers left the take-out note (a straggler while a spare waits, :mod:`training.job.stragglers`)
  leaves the job at its next ``next_rendezvous()``: a ``taken-out/<id>`` key first, then its lease revoked,
  :class:`NodeTakenOut` raised (the agent's exit 0), the rendezvous left open. A round that replaces it records it
  as ``taken_out``: the other agents say so and do not SIGKILL their workers, which stop at the same step
  boundary by themselves (after the step's snapshot), or in an in-place job recover in place while the spare's
  workers take the straggler's ranks (:func:`.rounds.keeps_workers`). Every agent tells its workers how many
  spares wait (the round record's ``spares``, kept by the closer) through :mod:`training.job.agent_notes`.

While no etcd member answers, training goes on (no collective needs etcd); the keep-alive thread and the
watches say so once and reconnect; only a new round waits for the store, and says so. A member key missing
right after an outage is not a lost node until the store has answered for a lease's time (a store that was
stopped, not restarted, expires every lease when it wakes; each agent then joins again).

This module is torch's handler interface and the agent's loop to a place; it composes small parts, one idea a
module (as torch's own dynamic rendezvous divides into a state holder, an executor and small operations):
:mod:`.membership` (the lease and member key, the keep-alive thread), :mod:`.head_view` (the watched head and
this agent's seat), :mod:`.joining` (its join, withdrawal, confirmation, the next round opened), :mod:`.closer`
(the oldest member's role), :mod:`.round_store` (the round's ``TCPStore``), :mod:`.ending` (the job's end),
:mod:`.watched` (a watched key or prefix) and :mod:`.layout` (the job's keys, the round's one transaction).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Callable

from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)

from training.checkpoint import generation
from training.job import agent_notes
from training.launch.rendezvous import dead_agent, ending, rounds
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused, StoreUnavailable
from training.launch.rendezvous.closer import Closer
from training.launch.rendezvous.head_view import HeadView
from training.launch.rendezvous.joining import Joining
from training.launch.rendezvous.layout import put_round, say  # noqa: F401 - put_round: tests import it from here
from training.launch.rendezvous.membership import Membership
from training.launch.rendezvous.round_store import RoundStore
from training.launch.rendezvous.round_store import RoundChanged as _RoundChanged
from training.launch.rendezvous.watched import Watched

BACKEND = "t5-etcd"
#: Seconds a finished job keeps trying to close its rendezvous while the store does not answer.
CLOSE_WAIT_S = 60.0
#: Seconds ``shutdown()`` waits in all for the handler's threads to end (each ends at once, or after the store
#: call it is in, whose own timeouts bound it).
THREADS_STOP_S = 10.0
#: An agent started with this variable set to 1 asks to be a hot spare: it is given a place last.
STANDBY_ENV = "T5_STANDBY"
#: The node's index as the cluster numbers it (set by the launchers); the first round orders nodes by it.
NODE_INDEX_ENV = "T5_NODE_RANK"
_on_lost: list[Callable[[str], None]] = []


def set_on_lost(callback: Callable[[str], None]) -> None:
    """What this process does to its workers when a node of its round is lost (the agent: SIGKILL them)."""
    _on_lost[:] = [callback]


def add_on_lost(callback: Callable[[str], None]) -> Callable[[], None]:
    """One more thing to do then (the in-place agent's: its workers that have no heartbeat file, those in a
    recovery); returns what takes it away again."""
    _on_lost.append(callback)
    return lambda: _on_lost.remove(callback) if callback in _on_lost else None


def notify_lost(lost: str) -> None:
    """Do what :func:`set_on_lost` and :func:`add_on_lost` registered: a round that does not keep this node's
    workers replaced lost node(s) ``lost`` (their ids)."""
    for callback in list(_on_lost):
        callback(lost)


class EtcdRendezvousHandler(RendezvousHandler):
    """See the module docstring. Built by :func:`create_handler` from torchrun's rendezvous parameters."""

    def __init__(
        self,
        run_id: str,
        client: EtcdClient,
        *,
        min_nodes: int,
        max_nodes: int,
        ttl_s: int,
        last_call_s: float,
        join_timeout_s: float,
        local_addr: str | None = None,
        standby: bool = False,
        node_index: int | None = None,
        in_place: bool = False,
    ):
        self.run_id = run_id
        self.client = client
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.ttl_s, self.last_call_s, self.join_timeout_s = ttl_s, last_call_s, join_timeout_s
        self.addr = local_addr or socket.getfqdn()
        self.standby = standby
        self.node_index = node_index
        self.in_place = in_place
        self.me = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.prefix = client.key(f"rdzv/{run_id}/")
        self.round: rounds.Round | None = None  # the formed round it trains in, as its head gave it
        self._seat: tuple[int, str, int] | None = None  # that round's number, this agent's id and rank in it
        self._said_lost_of = -1
        self._stores = RoundStore(self.addr, join_timeout_s, self._current)  # serves rounds it has rank 0 in
        self._hosting = False  # rank 0 of the round it trains in: others use its store until they leave
        self._place_store = None  # that round's store (its key prefix on its rank 0's agent's server)
        self._stop = threading.Event()
        value = {
            "addr": self.addr,
            "pid": os.getpid(),
            "standby": standby,
            "node": node_index,
            "store": f"{self.addr}:{self._stores.server.port}",
        }
        self._membership = Membership(
            client,
            self.prefix,
            self.me,
            value,
            ttl_s=ttl_s,
            join_timeout_s=join_timeout_s,
            stop=self._stop,
            on_rejoined=self._confirm_seat,
        )
        self._closer = Closer(
            client,
            self.prefix,
            self.me,
            self._membership,
            self._stop,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_s=last_call_s,
            threads_stop_s=THREADS_STOP_S,
            in_place=in_place,
        )
        self._taken_out = False
        self._spares_told = -1
        self._membership.join()
        self._head = HeadView(client, self.prefix, self.me).start()
        self._joining = Joining(
            client, self.prefix, self.me, self._membership, self._head, self._stop, start=self._start_kept
        )
        self._threads = [
            self._start(self._membership.keep_alive, "t5f-rdzv-lease"),
            self._start(self._closer.run, "t5f-rdzv-closer"),
        ]  # shutdown() waits for them

    @staticmethod
    def _start(target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def _start_kept(self, target: Callable[[], None], name: str) -> None:
        """Start a thread that :meth:`_stop_threads` waits for."""
        self._threads.append(self._start(target, name))

    def _stop_threads(self) -> None:
        """Stop the watch and wait (:data:`THREADS_STOP_S` in all) for every thread of this handler to end; the
        closer's own watches end with it (it stops them on its way out)."""
        deadline = time.monotonic() + THREADS_STOP_S
        self._stop.set()
        self.round_view.stop(join_s=THREADS_STOP_S)
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ membership (.membership)
    @property
    def _lease(self) -> int:
        return self._membership.lease

    @property
    def _member_rev(self) -> int:
        return self._membership.member_rev

    def _keep_alive_once(self) -> None:
        self._membership.keep_alive_once()

    def _renew_membership(self, expired: int) -> None:
        self._membership.renew(expired)

    def _confirm_seat(self) -> None:
        """After joining again under a new lease: its place's confirmation went with the old one."""
        if self._seat is not None:
            self._joining.confirm(self._seat[0])

    # ------------------------------------------------------------------ the round's head (.head_view)
    @property
    def round_view(self) -> Watched:
        """The watch on the round's head."""
        return self._head.watch

    def _current(self) -> tuple[rounds.Head | None, int]:
        """The round's head as the watch last delivered it, and its mod revision (:meth:`.HeadView.current`)."""
        return self._head.current()

    def _wait_for_change(self, revision: int, timeout_s: float = 1.0) -> None:
        self._head.wait_for_change(revision, timeout_s)

    # ------------------------------------------------------------------ torch's RendezvousHandler
    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return False

    def get_run_id(self) -> str:
        return self.run_id

    def is_closed(self) -> bool:
        r, _ = self._current()
        return bool(r and r.closed)

    def set_closed(self) -> None:
        """Mark the rendezvous closed (the job ended). The first agent there writes it; the others find it closed
        (in the head they watch, or in the record) and write nothing: every agent of a 1,024-node job rewriting
        the whole record at its end was 1,024 x ~35 KiB through the members' raft log."""
        head, _ = self._current()
        if head is not None and head.closed:
            return
        ending.close_round(self.client, self.prefix)

    def take_out_if_dead(self, node_rank: int) -> str:
        """Revoke the lease of the agent at ``node_rank`` of the round this agent trains in when that agent is
        dead (its store refuses connections, :mod:`.dead_agent`), so the round re-forms now rather than after the
        lease's TTL; "" when nothing was done (this node, alive, unreachable, gone already), else one line."""
        r = self.round
        if r is None:
            return ""
        try:
            member = dead_agent.member_at(self.client, self.prefix, r.n, node_rank)
            refused = dead_agent.take_out_if_dead(self.client, self.prefix, member) if member != self.me else ""
        except (StoreUnavailable, StoreRefused):
            return ""  # the store away: the lease's TTL decides, as before
        if not refused:
            return ""
        return (
            f"node {member} (rank {node_rank} of round {r.n}) is gone: its agent's store {refused} refuses "
            f"connections; its membership lease revoked, so the round re-forms now, not after its TTL ({self.ttl_s} s)"
        )

    def num_nodes_waiting(self) -> int:
        mine = self.round
        current, _ = self._current()
        self._tell_workers_spares(mine, current)
        if mine is None or current is None or current.n <= mine.n or current.closed:
            return 0
        if self._take_over_in_place(mine, current) is not False:  # taken, or to try again at the next look
            return 0
        self._say_lost(mine, current)
        return max(1, current.arriving)  # torch counts the late nodes; 1 for a newer round for any other reason

    def _take_over_in_place(self, mine: rounds.Round, current: rounds.Head) -> bool | None:
        """Take a place in ``current`` without stopping this node's workers, when it replaces lost nodes around
        them in an in-place job (its scope is ``mine``'s: :func:`.rounds.keeps_workers`): True once taken; False
        when ``current`` is no such round, or not this node's, or the rendezvous refuses: then torchrun restarts
        the workers as in any job. None when the place cannot be read now (the store away or slow, the head not
        caught up): the monitor asks again at its next look, the workers go on. (That gave up the first time, and a
        store read slow under load cost a full restart.) The wait is bounded by the round itself: a participant
        that never confirms counts as stuck and the next round leaves it out, which is a round of its own scope."""
        if not (self.in_place and current.formed and current.lost and current.in_place_scope == mine.in_place_scope):
            return False
        try:
            r, _, seats = self._read_open_round()
            if r is None or seats is None or r.n != current.n:
                return None  # the read and the head this agent was told of disagree: the next look has both newer
            if self.me not in seats.ranks:
                return False
            self._take_place(r, seats)
        except (StoreUnavailable, _RoundChanged):
            return None
        except (StoreRefused, RendezvousError):
            return False
        self._joining.confirm(r.n)
        left = [p for p in current.lost if p in set(current.taken_out)]
        why = (
            "taken out as a straggler"
            if len(left) == len(current.lost)
            else f"membership lease ended: TTL {self.ttl_s} s, or revoked as its agent is dead"
        )
        say(
            f"lost node(s) of round {mine.n}: {', '.join(current.lost)} ({why}): round {r.n} keeps this node's "
            f"workers running (in-place recovery, scope {r.in_place_scope}); the lost ranks' replacements join them"
        )
        return True

    def _say_lost(self, mine: rounds.Round, current: rounds.Head) -> None:
        """Once per round of this node's: say which of its nodes newer round ``current`` replaces and why; unless
        they left on purpose (taken out as stragglers), SIGKILL this node's workers (:func:`set_on_lost`)."""
        lost = current.lost  # a round that replaces lost nodes follows the formed round they were in: this one
        if lost and set(lost) <= set(current.taken_out) and self._said_lost_of < mine.n:
            self._said_lost_of = mine.n  # a straggler's node left: every worker stops at the same step boundary
            say(
                f"node(s) of round {mine.n} left the job on purpose (taken out as a straggler): {', '.join(lost)}; "
                f"re-forming with a hot spare"
            )
        if lost and self._said_lost_of < mine.n:
            self._said_lost_of = mine.n
            stuck = [p for p in lost if p in set(current.stuck)]
            expired = [p for p in lost if p not in set(stuck)]
            why = (
                [f"{', '.join(expired)} (membership lease ended: TTL {self.ttl_s} s, or revoked as its agent is dead)"]
                if expired
                else []
            ) + (
                [
                    f"{', '.join(stuck)} (alive but did not take its place within "
                    f"{self.last_call_s + rounds.STOPPING_WORKERS_S:g} s: stuck)"
                ]
                if stuck
                else []
            )
            say(
                f"lost node(s) of round {mine.n}: {'; '.join(why)}: re-forming now; this node's workers are "
                f"SIGKILLed, as their collectives with the lost node cannot finish"
            )
            notify_lost(", ".join(lost))

    def _tell_workers_spares(self, mine: rounds.Round | None, current: rounds.Head | None) -> None:
        """Publish the formed round's spare count for this node's workers when it changes (their straggler watch
        takes a slow node out only when a spare waits, :mod:`training.job.stragglers`)."""
        count = current.spares if mine and current and current.n == mine.n and current.formed else 0
        if count != self._spares_told:
            agent_notes.publish_spares(count)
            self._spares_told = count

    def _leave_if_taken_out(self) -> None:
        """A worker of this node left the take-out note (a straggler, a spare waiting): leave the job instead of
        joining the next round: the member key goes at once (the lease revoked), so the closer re-forms the round
        with the spare without waiting out a TTL. Raises :class:`NodeTakenOut`."""
        reason = agent_notes.take_out_request()
        if reason is None:
            return
        self._taken_out = True
        self._stop.set()  # no keep-alive re-registers this member, no closer loop runs on
        try:  # first the note (no lease: it outlives this member), so the closer can tell a departure from a loss
            self.client.put(self.prefix + f"taken-out/{self.me}", reason)
            self.client.revoke(self._lease)
        except Exception:  # noqa: BLE001 - the lease then expires by itself within its TTL
            pass
        self._stop_threads()
        self.client.close()
        raise NodeTakenOut(reason)

    def shutdown(self) -> bool:
        """Close the rendezvous (the job ended); True once it is closed, False if it could not be closed (torch's
        contract: the store did not answer for :data:`CLOSE_WAIT_S`, said in one line). The agent that hosts the
        round's store keeps it up until the others have left torchrun's exit barrier (each says so before
        closing), at most :data:`.ending.EXIT_WAIT_S`. A node taken out of the job closes nothing: the job goes on
        without it."""
        if self._taken_out:
            return True
        if self.round is not None:
            ending.say_left(self.client, self.prefix, self.round.n, self.me, self._lease)
        closed = self._close_rendezvous()
        try:
            if closed and self._hosting and self.round is not None:
                ending.wait_for_others_to_leave(self.client, self.prefix, self.round.n)
        except Exception:  # noqa: BLE001 - the store went away again: the others' exit barrier decides
            pass
        self._stop.set()  # before the revoke: a renewal after it would find the lease gone and join again
        try:
            self.client.revoke(self._lease)
        except Exception:  # noqa: BLE001 - best effort: the lease expires by itself
            pass
        self._stop_threads()
        self.client.close()
        return closed

    def _close_rendezvous(self) -> bool:
        """Close it even if the store is away right now: spares standing by wait for this (a rendezvous left open
        gives them the ended job's place). Tries for :data:`CLOSE_WAIT_S`, saying so once; False (and a line)
        if it could not."""
        deadline, said = time.monotonic() + CLOSE_WAIT_S, False
        while True:
            try:
                self.set_closed()
                return True
            except StoreUnavailable as e:
                if time.monotonic() > deadline:
                    say(
                        f"could not close the rendezvous of {self.run_id}: no membership store member answered "
                        f"for {CLOSE_WAIT_S:g} s ({e}); spares still waiting may start this ended job's workers: "
                        f"stop them"
                    )
                    return False
                if not said:
                    say(f"the job ended; closing its rendezvous waits for the membership store ({e})")
                    said = True
                time.sleep(0.5)
            except StoreRefused as e:
                say(f"could not close the rendezvous of {self.run_id}: the membership store refused it ({e})")
                return False

    def next_rendezvous(self):
        self._leave_if_taken_out()
        last = self.round.n if self.round else -1
        deadline = time.monotonic() + self.join_timeout_s
        waited_for_store, joined_round = False, None
        while True:
            lease = self._lease
            try:
                r, revision, seats = self._read_open_round()
                step = rounds.agent_step(
                    self.me,
                    last,
                    r,
                    joined_round == ((r.n, self._lease) if r else None),
                    max_nodes=self.max_nodes,
                    seats=seats,
                )
                if step is rounds.Step.DONE:
                    try:
                        info = self._take_place(r, seats)
                    except _RoundChanged:
                        continue
                    if joined_round != (r.n, lease):  # a round formed without this agent's join: say it came
                        self._joining.confirm(r.n)
                    return info
                if step is rounds.Step.NEW_ROUND:
                    self._joining.open_next_round(r, revision)
                    self._wait_for_change(revision)  # lost the race or won it: read again once the watch has it
                    continue
                if step is rounds.Step.JOIN:
                    self._joining.join(r.n, lease)
                    joined_round = (r.n, lease)  # a renewed lease (the old one expired) means joining again
                    continue
            except StoreUnavailable as e:
                if not waited_for_store:
                    say(f"a new round waits for the membership store ({e})")
                    waited_for_store = True
                time.sleep(0.2)
                continue
            except StoreRefused as e:
                if "lease not found" not in str(e):
                    raise RendezvousError(f"the membership store refused this agent: {e}") from e
                self._renew_membership(lease)  # it expired while the store was away: join again
                joined_round = None
                continue
            if step is rounds.Step.WAIT and time.monotonic() > deadline:
                if joined_round is not None and self._joining.withdraw(joined_round[0]):
                    self._wait_for_change(revision)  # the round formed with it meanwhile: take the place
                    continue
                raise self._not_formed(r)
            if step is rounds.Step.STAND_BY:
                deadline = time.monotonic() + self.join_timeout_s
            self._wait_for_change(revision)

    def _read_open_round(self) -> tuple[rounds.Round | None, int, rounds.Seats | None]:
        """The round, its revision and this agent's seat (:meth:`.HeadView.read`); raises
        :class:`RendezvousClosedError` once the rendezvous is closed."""
        r, revision, seats = self._head.read(self._seat)
        if r is not None and r.closed:  # not torch's RendezvousGracefulExitError: torch 2.13's launch_agent
            # fails on it (AttributeError, exit 1) and the agent could not tell; see the canary test
            if rounds.ended_in_my_round(r, self.round.n if self.round else None):
                raise JobStoppedByAnotherNode(
                    f"the rendezvous of {self.run_id} was closed while this node's round {self.round.n} was the "
                    "newest: another node ended the job before this node's workers finished (its log says why, "
                    "e.g. its --max-restarts were used up)"
                )
            raise RendezvousClosedError(f"the rendezvous of {self.run_id} is closed (the job ended)")
        return r, revision, seats

    def _not_formed(self, r: rounds.Round | None) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"{f'round {r.n}' if r else 'the first round'} of {self.run_id} did not form "
            f"within {self.join_timeout_s:g} s (MIN {self.min_nodes} node(s))"
        )

    def _take_place(self, r: rounds.Round, seats: rounds.Seats):
        rank = seats.ranks[self.me]
        store = self._stores.connect(r)
        self.round, self._hosting, self._seat = r, rank == 0, (r.n, self.me, rank)
        self._place_store = store
        generation.note(generation.Generation(round=r.n, prefix=self.prefix, scope=r.scope))  # the commit fence's
        say(f"round {r.n}: rank {rank} of {seats.size} node(s)")
        return RendezvousInfo(store, rank, seats.size, self._stores.info(r, rank, store))

    def place_store(self):
        """The store of the round this agent holds its place in now (None before it has one): what
        ``next_rendezvous()`` gave torchrun, or, after an in-place take-over (:meth:`_take_over_in_place`), the new
        round's, whose rank-0 agent may be another node's when rank 0's node was the one lost. The in-place agent's
        exit barrier waits on it (:meth:`training.launch.inplace_agent.InPlaceAgent._exit_barrier`)."""
        return self._place_store

    @property
    def _store_server(self):
        """This agent's store server (:class:`.round_store.RoundStore`), which the rounds it has rank 0 in use."""
        return self._stores.server

    def _round_store(self, r: rounds.Round):
        """Formed round ``r``'s store (:meth:`.round_store.RoundStore.connect`)."""
        return self._stores.connect(r)


class JobStoppedByAnotherNode(RendezvousClosedError):
    """The rendezvous was closed while this node re-formed its worker group in the job's newest round: another
    participant ended the job on a failure. The agent ends with a line and exit 1 (:mod:`training.launch.agent`),
    not a hot spare's exit 0: the job did not finish."""


class NodeTakenOut(RendezvousError):
    """This node left the job on purpose (a straggler taken out while a hot spare waits); the agent ends with a
    line and exit 0 (:mod:`training.launch.agent`), the job goes on without it."""


def create_handler(params) -> EtcdRendezvousHandler:
    """torchrun's creator for ``--rdzv-backend=t5-etcd``: credentials from ``T5_ETCD_*`` (the launcher sets
    them), timings from ``--rdzv-conf`` (keep_alive_interval x keep_alive_max_attempt = the lease TTL)."""
    creds = ClientCredentials.from_env()
    interval = float(params.get("keep_alive_interval", 1))
    attempts = int(params.get("keep_alive_max_attempt", 3))
    return EtcdRendezvousHandler(
        params.run_id,
        EtcdClient(creds),
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        ttl_s=max(1, round(interval * attempts)),
        last_call_s=float(params.get("last_call_timeout", 3)),
        join_timeout_s=float(params.get("join_timeout", 600)),
        local_addr=params.local_addr,
        standby=os.environ.get(STANDBY_ENV) == "1",
        node_index=_node_index(),
        in_place=params.get_as_bool("in_place", False),
    )


def _node_index() -> int | None:
    """This node's index from ``T5_NODE_RANK``, or None (unset or not a number: join order decides)."""
    value = os.environ.get(NODE_INDEX_ENV, "")
    return int(value) if value.isdigit() else None


def register() -> None:
    """Make ``--rdzv-backend=t5-etcd`` known to torchrun in this process (torch's public registry)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    try:
        rendezvous_handler_registry.register(BACKEND, create_handler)
    except ValueError:
        pass  # already registered in this process

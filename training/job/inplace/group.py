"""The survivor-side primitive of in-process recovery: drop the broken process group, agree the next epoch through
the membership store (:mod:`.agreement`), and build a new default process group for it, in the same process.

Each member serves a small ``TCPStore`` of its own from the start (as each agent serves one for its rounds,
``training.launch.rendezvous.round_store``); the new group forms on rank 0's, under a prefix of the epoch's own, so
no key of an earlier group is read by a later one and no process that may have died hosts the rendezvous of the
group formed without it. Only public torch is used: ``ProcessGroup.abort``, ``destroy_process_group``,
``init_process_group`` on a ``PrefixStore`` (bounded by the agreement's ``bound_s``: a member lost after the decision
never connects), ``ProcessGroup.set_timeout`` (the collectives' ``pg_timeout_s``), ``all_reduce``.

What a failure looks like here (gloo on CPU, torch 2.13): a SIGKILLed peer's sockets are reset by its kernel, so
the collectives of the ranks talking to it raise within milliseconds (the others' when those drop the group, see
below); a peer that stops answering with its sockets open (a
stopped or wedged process) is found only by the collective's timeout (``pg_timeout_s``): gloo's ``abort()`` does
not cut a collective that is blocked (NCCL's does). Model, optimizer, data position and compiled code are the
caller's objects and stay as they are; the caller re-creates what holds the old group (a DeviceMesh) from
:attr:`InPlaceGroup.membership`.

    group = InPlaceGroup(board, member="host-1234", settings=GroupSettings())
    group.form()                          # first group, or joining a running job (state comes from a survivor)
    while training:
        failed = False
        try:
            if group.joiner_waiting():    # one all_reduce: every rank answers the same at the same step
                group.recover(step)
            train_one_step()
        except RuntimeError:              # the step's collective lost a peer
            failed = True
        if failed:                        # outside the except block (see recover())
            group.recover(step)           # raises InPlaceFailed when it cannot: let the job restart as today

A blocked gloo collective ends when a peer's connection closes, and a survivor's connections close only when its
old group is freed: a peer killed in the middle of a collective resets the connections of the ranks that were
talking to it, and the others (a small all_reduce talks to only some peers at a time) learn of the failure when
those ranks drop the group. ``destroy_process_group`` drops it, unless the caught exception's traceback still
holds the failed collective (and the group): hence recover() outside the except block; it refuses to run inside
one. Measured: the second survivor's collective raised 11 ms after the first's when the first recovered after
its except block; 1.0 s later (when the first's new group formed and the old one was freed) when inside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import threading
import time
from dataclasses import dataclass, field

from training.job.agent_notes import cut_request
from training.job.inplace.agreement import (
    AgreementSettings,
    BoardUnavailable,
    CheckIn,
    InPlaceFailed,
    MembershipBoard,
    Membership,
    NotChosen,
    agree,
)
from training.job.inplace.sockets import GroupSockets, shut_down

#: Key prefix of one epoch's group on rank 0's store.
GROUP_PREFIX = "t5f/inplace/{epoch}/"


def say(line: str) -> None:
    """One line on stderr, as the launcher's parts say what they do."""
    print(f"[inplace] {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class GroupSettings:
    """How a member re-forms its process group.

    Attributes:
        agreement: how long members wait for each other (:class:`~.agreement.AgreementSettings`).
        backend: the process group's backend (``gloo`` on CPU; ``nccl`` on GPUs).
        pg_timeout_s: the new group's collective timeout: how long a silent peer (sockets open, no answer) blocks a
            collective before it raises and the survivors re-form (a killed peer is found at once).
        store_host: the address the other members reach this member's store server at.
        watch_s: seconds between two looks at the store for a joiner (rank 0's background thread, off the step's
            path), and at this node's agent's note asking this member to cut its group (every member: a local file).
        keep_ports: ports of services this process reaches besides the group (etcd's): a cut of the group never
            shuts their connections (the epoch's store and this member's own store server are kept without it).
    """

    agreement: AgreementSettings = field(default_factory=AgreementSettings)
    backend: str = "gloo"
    pg_timeout_s: float = 30.0
    store_host: str = "127.0.0.1"
    watch_s: float = 0.05
    keep_ports: frozenset[int] = frozenset()


@dataclass
class Timings:
    """Seconds the last formation took, by part (for the line it says and the tests' figures)."""

    release_s: float = 0.0
    agree_s: float = 0.0
    build_s: float = 0.0


class InPlaceGroup:
    """This member's view of the job's process group across failures (see the module docstring)."""

    def __init__(self, board: MembershipBoard, member: str, settings: GroupSettings):
        import torch.distributed as dist

        self.board, self.member, self.settings = board, member, settings
        # wait_for_workers=False: members connect and go as epochs come; nobody waits for a fixed number of them
        self._server = dist.TCPStore(
            settings.store_host, 0, is_master=True, wait_for_workers=False, timeout=self._store_timeout()
        )
        self.store_addr = f"{settings.store_host}:{self._server.port}"
        self.membership: Membership | None = None
        self.timings = Timings()
        self._joiner = threading.Event()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        # the connections of the group being used, and its epoch (None while none can be cut: forming, released)
        self._sockets = GroupSockets()
        self._cut_lock = threading.Lock()
        self._cuttable: int | None = None
        self._store_port = 0
        # the connections of the epochs this member left that were still open when it left (cut_left_over)
        self._left_over: set[int] = set()

    def _store_timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.settings.agreement.bound_s)

    # ------------------------------------------------------------------ forming
    def form(self, first_world: int = 1, bound_s: float | None = None) -> Membership:
        """Join the job: the first epoch (everyone may decide; ``first_world`` members make the job) or the next
        epoch of a running one, whose survivors let this member in at a step boundary. A decision made without this
        member (it checked in late) is no failure for a joiner: it checks in to the epoch after. ``bound_s``: how
        long to try (default: the agreement's bound; a job's first start may give its workers longer)."""
        start = time.monotonic()
        bound_s = self.settings.agreement.bound_s if bound_s is None else bound_s
        while True:
            previous = self.board.latest()
            me = CheckIn(self.member, -1, -1, self.store_addr)
            left = bound_s - (time.monotonic() - start)
            try:
                settings = self._within(left, first_world if previous is None else 1)
                decided = agree(self.board, me, previous, settings)
            except NotChosen:
                continue
            except InPlaceFailed as e:
                say(str(e))
                raise
            self.timings = Timings(agree_s=time.monotonic() - start)
            return self._build(decided)

    def recover(self, step: int) -> Membership:
        """After this member's collective failed, or at a step boundary all members agreed on
        (:meth:`joiner_waiting`): drop the group, agree the next epoch with ``step`` (the last step whose
        collectives completed here) and build its group. The returned membership's ``step`` is where to resume:
        ``step`` itself or one before it (roll back one step). Raises :class:`InPlaceFailed` after saying why in one
        line: the caller lets the job restart as it does today."""
        if self.membership is None:
            raise RuntimeError("recover() before form(): a member re-forms only a group it was in")
        if sys.exc_info()[1] is not None:
            raise RuntimeError(
                "recover() called inside an except block: the exception's traceback holds the failed collective "
                "and with it the old group's connections, so a peer blocked on this member would wait for its "
                "timeout: note the failure in the except block and call recover() after it"
            )
        t0 = time.monotonic()
        with self._cut_lock:  # out of its collective already: nothing of the old group to cut any more
            self._cuttable = None
        release()
        with self._cut_lock:  # what the old epoch's groups still hold open: work left running on them
            self._left_over |= self._sockets.connections(self._kept_ports())
        t1 = time.monotonic()
        me = CheckIn(self.member, step, self.membership.rank(self.member), self.store_addr)
        try:
            decided = agree(self.board, me, self.membership, self.settings.agreement)
        except InPlaceFailed as e:
            say(str(e))
            raise
        self.timings = Timings(release_s=t1 - t0, agree_s=time.monotonic() - t1)
        return self._build(decided)

    def _within(self, left_s: float, at_least: int) -> AgreementSettings:
        """The agreement's settings for what is left of a join's bound, with ``at_least`` members."""
        a = self.settings.agreement
        if left_s <= a.gather_s:
            raise InPlaceFailed(
                f"in-place recovery: {self.member} found no epoch to join within {a.bound_s:g} s: falling back to "
                f"a full restart"
            )
        return dataclasses.replace(a, bound_s=left_s, min_members=max(a.min_members, at_least))

    def _build(self, decided: Membership) -> Membership:
        """The default process group for ``decided``, formed on its rank 0's store under the epoch's prefix."""
        import torch.distributed as dist

        t = time.monotonic()
        try:
            if decided.store == self.store_addr:
                base = self._server
            else:
                host, _, port = decided.store.rpartition(":")
                base = dist.TCPStore(host, int(port), is_master=False, timeout=self._store_timeout())
            with self._cut_lock:  # the group's connections are the sockets made from here on
                self._cuttable = None
                self._sockets.mark()
                self._store_port = int(decided.store.rpartition(":")[2])
            # bounded like the agreement: a member lost after the decision never connects (a second failure)
            dist.init_process_group(
                self.settings.backend,
                store=dist.PrefixStore(GROUP_PREFIX.format(epoch=decided.epoch), base),
                rank=decided.rank(self.member),
                world_size=decided.world_size,
                timeout=self._store_timeout(),
            )
        except RuntimeError as e:  # torch's DistError and its store errors are RuntimeErrors
            lost = InPlaceFailed(
                f"in-place recovery: the group of epoch {decided.epoch} did not form within "
                f"{self.settings.agreement.bound_s:g} s (a member lost during the recovery? {str(e)[:120]!r}): "
                f"falling back to a full restart from the newest complete snapshot"
            )
            say(str(lost))
            raise lost from None
        dist.group.WORLD.set_timeout(datetime.timedelta(seconds=self.settings.pg_timeout_s))
        self.timings.build_s = time.monotonic() - t
        self.membership = decided
        with self._cut_lock:
            self._cuttable = decided.epoch
        self._joiner.clear()
        self._start_watching()
        tm = self.timings
        say(
            f"epoch {decided.epoch}: {self.member} is rank {decided.rank(self.member)} of {decided.world_size}, "
            f"resuming at step {decided.step} (release {tm.release_s:.3f} s, agree {tm.agree_s:.3f} s, "
            f"build {tm.build_s:.3f} s)"
        )
        return decided

    # ------------------------------------------------------------------ joiners
    def joiner_seen(self) -> bool:
        """Whether this member's watcher saw a joiner checked in (rank 0 alone looks): a caller that agrees its
        step-boundary flags in a collective of its own adds this one to it instead of calling
        :meth:`joiner_waiting`."""
        return self._joiner.is_set()

    def joiner_waiting(self) -> bool:
        """Whether any member saw a joiner checked in for the next epoch: one ``all_reduce`` (MAX) on the group, so
        every member answers the same at the same step boundary and no rank trains on into a collective its peers
        left. Raises what a collective raises when a peer is lost (then :meth:`recover`)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.joiner_seen() else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _start_watching(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="t5f-inplace-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Every member reads its agent's note asking it to cut its group (:meth:`cut`); rank 0 alone reads the
        store for joiners (one reader per job, however many ranks): :meth:`joiner_waiting`'s all_reduce gives every
        rank its answer."""
        while not self._stop.wait(self.settings.watch_s):
            asked = cut_request()
            if asked is not None:
                self.cut(*asked)
            seen = self.membership
            if seen is None or seen.rank(self.member) != 0:
                continue
            try:
                waiting = set(self.board.check_ins(seen.epoch + 1)) - set(seen.members)
            except BoardUnavailable:
                continue  # the next look may get through; a failure meanwhile is found by the collectives
            if waiting and self.membership is seen:  # not a look at an epoch that has since formed
                self._joiner.set()

    # ------------------------------------------------------------------ cutting a blocked collective
    def cut(self, epoch: int, why: str) -> int | None:
        """End a collective of ``epoch``'s group that is blocked on a peer the others already left for (a lost
        node's silent worker, a survivor gone to the next epoch): abort the group (NCCL's abort ends its
        collectives; gloo's does not) and shut down its connections (:mod:`.sockets`: gloo's then raise "Connection
        closed by peer"), so this member's step fails as on a killed peer and it recovers in its process. Called
        from the watcher thread at its agent's request. Returns the connections shut down, or None when ``epoch``
        is not the group in use (formed since, or being released: nothing to cut)."""
        import torch.distributed as dist

        with self._cut_lock:
            if epoch != self._cuttable:
                return None
            self._cuttable = None
            try:
                dist.group.WORLD.abort()
            except (RuntimeError, AttributeError):  # a backend without abort, or the group already gone
                pass
            cut = self._sockets.cut(self._kept_ports())
        say(
            f"epoch {epoch}: {self.member} cut its group at its agent's request ({why}): {cut} connection(s) shut "
            f"down, so its blocked collective fails and it recovers in its process"
        )
        return cut

    def cut_left_over(self) -> int:
        """Shut down the connections of the epochs this member left that are still open: an old group's work left
        running (a checkpoint save or snapshot the recovery abandoned, blocked in a collective on a survivor whose
        own is blocked elsewhere) then fails at once, instead of holding its thread, its buffers and, at the end,
        the worker's exit (a worker process joins its threads) until that collective's timeout. Call it once the
        caller let the old epoch's work go (nothing of the old groups is used after that). Returns how many."""
        with self._cut_lock:
            left, self._left_over = self._left_over, set()
        cut = shut_down(left)
        if cut:
            say(
                f"{self.member}: {cut} connection(s) of the groups it left shut down (work abandoned on them ends "
                "now, not at its collectives' timeout)"
            )
        return cut

    def _kept_ports(self) -> frozenset[int]:
        """The services a cut leaves alone: etcd's, the epoch's store, this member's own store server."""
        return frozenset(self.settings.keep_ports | {self._store_port, self._server.port})

    def close(self) -> None:
        """Stop watching and drop the group (the store server goes with this object)."""
        with self._cut_lock:
            self._cuttable = None
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=self.settings.watch_s * 4)
        release()


def release() -> None:
    """Drop the default process group, whatever state its peers left it in: abort what the backend can abort
    (NCCL's communicators; gloo's is a no-op for a blocked collective), then destroy it so a new one can be
    initialised in this process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.group.WORLD.abort()
    except RuntimeError:  # a backend without abort: destroying it below is all there is
        pass
    dist.destroy_process_group()

"""What a worker does when a peer's process dies: the trainer holds one of these and asks it, never which it is.

* :class:`FullRestart` (``failover.in_place`` off, the default): the process group comes from the agent's
  environment (``init_process_group``), a collective failure is not caught, the worker ends and its agent restarts
  the whole group (docs/failover.md).
* :class:`InPlace` (``failover.in_place`` on): the group is formed through the job's etcd
  (:class:`training.job.inplace.group.InPlaceGroup`); a collective failure (``DistError``) is caught at the step
  boundary, and :meth:`InPlace.recover`, called after the except block, agrees the new membership and builds its
  group; the trainer then rebuilds what holds the old group and asks its checkpoint manager for the state
  (docs/inprocess.md). A joiner seen by rank 0's watcher is agreed in the trainer's step-boundary collective.
  Anything it cannot agree raises :class:`~training.job.inplace.agreement.InPlaceFailed` after one line: the worker
  ends as without it, and today's full restart follows.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Callable, TypeVar
from urllib.parse import urlsplit

import torch.distributed as dist

from training.config import Config, ConfigError
from training.errors import PeerTakenOut
from training.job.inplace import agreement
from training.job.inplace.agreement import AgreementSettings, InPlaceFailed, Membership
from training.job.inplace.group import GroupSettings, InPlaceGroup

T = TypeVar("T")
#: How gloo words a collective that lost its peer (torch 2.13, CPU): its transport's errors name their source file.
PEER_LOSS_MARKS = ("gloo/transport/", "Connection reset by peer", "Connection closed by peer")


class FullRestart:
    """Today's behaviour: nothing is caught, nothing is re-formed."""

    catches: tuple[type[BaseException], ...] = ()  # `except ()` catches nothing: a failure ends the worker
    overlaps_group = False  # the start's phases stay in order (the startup clock's figures as before)
    lost_ranks: frozenset[int] = frozenset()  # never re-formed: no rank is ever lost to a recovery

    @staticmethod
    def peer_lost(error: BaseException) -> str:
        return ""

    def __init__(self, backend: str):
        self.backend = backend

    def join(self, timeout: timedelta) -> None:
        dist.init_process_group(backend=self.backend, timeout=timeout)

    def first_start(self, take: Callable[[], T]) -> T | None:
        """Run ``take`` (a collective of the job's first start, e.g. the run lock)."""
        return take()

    def joiner_seen(self) -> bool:
        return False

    def joined_epoch(self) -> int | None:
        """The epoch this process joined a running job in (None: it started with the job's group)."""
        return None

    def mesh_dims(self) -> tuple[str, ...] | None:
        """The device mesh's dimension names (None: unnamed, as it always was)."""
        return None

    def recover(self, step: int) -> Membership:  # never reached: nothing is caught
        raise InPlaceFailed("in-place recovery is off (failover.in_place): a full restart follows")

    def cut_left_over(self) -> int:
        return 0

    def close(self) -> None:
        pass


class InPlace:
    """In-process recovery on the job's etcd (module docstring)."""

    # gloo reports a peer's reset connection as a plain RuntimeError: peer_lost() tells it from other errors
    catches: tuple[type[BaseException], ...] = (RuntimeError,)
    # the model's meta build runs while the group forms (training.job.prebuild): a replacement's start is on the
    # survivors' critical path
    overlaps_group = True

    @staticmethod
    def peer_lost(error: BaseException) -> str:
        """One line saying what a collective raised when ``error`` is a lost peer (torch's DistError: a timeout, a
        store; gloo's transport errors: a reset or closed connection) or a straggler's node leaving
        (:class:`~training.errors.PeerTakenOut`), else "" (any other error ends the worker: a bug recovered in
        place would fail again at the same step, for ever)."""
        if isinstance(error, PeerTakenOut):  # every rank agreed it at this step boundary (training.job.stragglers)
            return f"a straggler's node left: {' '.join(str(error).split())[:180]}"
        text = " ".join(f"{type(error).__name__}: {error}".split())
        lost = isinstance(error, dist.DistError) or any(mark in text for mark in PEER_LOSS_MARKS)
        return text[:200] if lost else ""

    def __init__(self, group: InPlaceGroup, first_world: int, join_bound_s: float):
        self.group, self.first_world, self.join_bound_s = group, first_world, join_bound_s
        self.membership: Membership | None = None
        self.lost_ranks: frozenset[int] = frozenset()  # the last recovery's: ranks of the epoch before, gone
        self._joined: int | None = None

    def join(self, timeout: timedelta) -> None:
        # the workers of a start come up within the start-up timeout of each other, not the recovery's bound
        self.membership = self.group.form(self.first_world, bound_s=max(self.join_bound_s, timeout.total_seconds()))
        self._joined = self.membership.epoch if self.membership.epoch > 1 else None

    def first_start(self, take: Callable[[], T]) -> T | None:
        """``take`` on the members of the job's first group only: a joiner's peers are past their start (the run
        lock stays with the process that took it)."""
        return take() if self.membership is not None and self.joined_epoch() is None else None

    def joined_epoch(self) -> int | None:
        """The epoch this process joined a running job in (a replacement, a spare's worker), None when it formed the
        job's first group (epoch 1). Read at the start: a later recovery changes ``membership``, not how it came."""
        return self._joined

    def joiner_seen(self) -> bool:
        return self.group.joiner_seen()

    def mesh_dims(self) -> tuple[str, ...] | None:
        """A name of the group's epoch's own: torch reuses a DeviceMesh equal to an earlier one (same shape, ranks
        and names) for the DTensors built on a new one, and the earlier one's coordinate is this process's old rank
        (measured on torch 2.13: FSDP2's parameters of the re-formed group then held the old rank's mesh)."""
        return (f"fsdp_epoch{self.membership.epoch}",) if self.membership is not None else None

    def recover(self, step: int) -> Membership:
        """Drop the broken group, agree the next epoch with ``step`` (the last step completed here) and build its
        group; call it outside the except block that caught the failure (training.job.inplace.group says why).
        Notes the ranks of the epoch before whose members the new one does not hold (``lost_ranks``)."""
        before = self.membership
        self.membership = self.group.recover(step)
        kept = set(self.membership.members)
        self.lost_ranks = frozenset(i for i, m in enumerate(before.members) if m not in kept) if before else frozenset()
        return self.membership

    def cut_left_over(self) -> int:
        """Once the old epoch's work is let go (the old checkpoint manager closed): cut what of it is still
        connected, so an abandoned save or snapshot ends now (:meth:`InPlaceGroup.cut_left_over`)."""
        return self.group.cut_left_over()

    def close(self) -> None:
        self.group.close()


def member_id(rank: int | None = None, pid: int | None = None) -> str:
    """A worker's id in the membership (default: this one's): its start rank first (the first group's ranks sort as
    the agent gave them), then host and pid (unique per process, so a replacement is a new member). Its agent
    names it the same way when it reports the worker gone."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    return f"r{rank:05d}-{socket.gethostname()}-{os.getpid() if pid is None else pid}"


def endpoint_ports(endpoints: str) -> frozenset[int]:
    """The ports of a comma-separated list of ``scheme://host:port`` endpoints (the job's etcd members): a cut of
    a blocked group keeps their connections (:meth:`InPlaceGroup.cut`)."""
    ports = set()
    for url in filter(None, (e.strip() for e in endpoints.split(","))):
        try:
            port = urlsplit(url).port
        except ValueError:  # not a port: the board's own checks name the variable
            continue
        if port:
            ports.add(port)
    return frozenset(ports)


def build(cfg: Config, *, backend: str) -> FullRestart | InPlace:
    """From ``cfg.failover``; in-place needs the job's board installed
    (:func:`training.job.inplace.agreement.register_board`) and its etcd in the environment (``T5_ETCD_*``, as the
    agents')."""
    fo = cfg.failover
    if not fo.in_place:
        return FullRestart(backend)
    if agreement.board_factory is None:
        raise ConfigError(
            "failover.in_place needs the job's etcd board, which this project's agent installs in its workers "
            "(training.launch.inplace_board.install): start the job with python -m training.launch or make train, "
            "or turn failover.in_place off"
        )
    try:
        board = agreement.board_factory()
    except ValueError as e:  # a T5_ETCD_* variable missing or wrong: one line naming it
        raise ConfigError(f"failover.in_place needs the job's etcd: {e}; or turn failover.in_place off") from None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    settings = GroupSettings(
        agreement=AgreementSettings(bound_s=fo.in_place_bound_s, min_members=fo.in_place_min_world or world),
        backend=backend,
        pg_timeout_s=cfg.parallel.train_timeout_s,
        store_host=os.environ.get("T5F_INPLACE_HOST", "127.0.0.1"),
        keep_ports=endpoint_ports(os.environ.get("T5_ETCD_ENDPOINTS", "")),
    )
    return InPlace(InPlaceGroup(board, member_id(), settings), world, fo.in_place_bound_s)

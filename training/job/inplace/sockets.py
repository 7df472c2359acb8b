"""Cutting a gloo collective that is blocked on a silent peer: shut down this process's connections of the old group.

gloo's ``ProcessGroup.abort()`` returns without ending a collective blocked on a peer whose sockets stay open (a
stopped, wedged or cut-off process: measured on torch 2.13 CPU; NCCL's abort does end it). What ends a blocked gloo
collective is its connection closing: a killed peer's kernel resets it, and a ``shutdown()`` of this side's socket
does the same from here (measured: the blocked ``all_reduce`` raised gloo's ``Connection closed by peer`` at once,
and the process then formed a new group). So a member notes its TCP sockets before it builds an epoch's group
(:meth:`GroupSockets.mark`); the group's connections are the sockets made since (every gloo group the trainer
builds on it: the world's, the checkpoint tiers'), less those of the services the process keeps using, named by
their ports (the epoch's store, this member's own store server, etcd). :meth:`GroupSockets.cut` shuts them down.

Linux only (``/proc/self/fd`` and ``/proc/self/net/tcp*``); elsewhere nothing is cut and the agent's kill of a
blocked worker stays the fall-back (:mod:`training.launch.inplace_agent`). Torch-free.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

FD_DIR = "/proc/self/fd"
TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
ESTABLISHED = "01"  # the kernel's TCP state code in /proc/net/tcp


@dataclass(frozen=True)
class Connection:
    """One TCP socket's ports and state, from the kernel's table."""

    local_port: int
    remote_port: int
    state: str


def socket_inodes() -> dict[int, int]:
    """This process's sockets: inode -> file descriptor (empty where ``/proc`` is not there)."""
    found: dict[int, int] = {}
    try:
        fds = os.listdir(FD_DIR)
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"{FD_DIR}/{fd}")
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            found[int(target[8:-1])] = int(fd)
    return found


def tcp_connections() -> dict[int, Connection]:
    """The TCP sockets of this process's network namespace: inode -> :class:`Connection`."""
    table: dict[int, Connection] = {}
    for path in TCP_TABLES:
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10:
                continue
            local, remote = (int(c.rsplit(":", 1)[1], 16) for c in cols[1:3])
            table[int(cols[9])] = Connection(local, remote, cols[3])
    return table


def shut_down(inodes: set[int]) -> int:
    """``shutdown(SHUT_RDWR)`` each of this process's sockets whose inode is in ``inodes`` (through a duplicate of
    its descriptor, checked to be the same socket: a descriptor may be closed and reused meanwhile); the socket
    stays open for its owner, which sees it closed. Returns how many were shut down."""
    done = 0
    for inode, fd in socket_inodes().items():
        if inode not in inodes:
            continue
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino != inode:
                continue
            sock = socket.socket(fileno=dup)
            try:
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
            except OSError:  # not connected any more: nothing to cut
                pass
            finally:
                sock.detach()  # the duplicate is closed below, once
        finally:
            os.close(dup)
    return done


class GroupSockets:
    """The connections this process made for its process groups since :meth:`mark` (module docstring)."""

    def __init__(self) -> None:
        self._before: set[int] | None = None

    def mark(self) -> None:
        """Note the sockets that exist now: those made later are the next group's."""
        self._before = set(socket_inodes())

    def connections(self, keep_ports: frozenset[int]) -> set[int]:
        """Inodes of the established TCP sockets made since :meth:`mark`, less those whose remote port (a
        service this process reaches) or local port (a service it serves) is in ``keep_ports``."""
        if self._before is None:
            return set()
        table = tcp_connections()
        made = set(socket_inodes()) - self._before
        return {
            inode
            for inode in made
            if inode in table
            and table[inode].state == ESTABLISHED
            and table[inode].remote_port not in keep_ports
            and table[inode].local_port not in keep_ports
        }

    def cut(self, keep_ports: frozenset[int]) -> int:
        """Shut down :meth:`connections`; returns how many. The mark is dropped: a group is cut once."""
        cut = shut_down(self.connections(keep_ports))
        self._before = None
        return cut

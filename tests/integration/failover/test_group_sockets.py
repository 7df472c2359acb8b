"""Cutting a blocked group's connections (training/job/inplace/sockets.py) on real loopback sockets: what was made
since the mark is cut, what existed before and the kept services' connections are not, and the peer of a cut
socket reads its end at once. The cut of a real gloo collective: test_inplace_recovery.py; the agent's note and the
kept etcd ports: tests/unit/failover/test_cut_request.py."""

from __future__ import annotations

import socket

import pytest

from training.job.inplace.sockets import GroupSockets, socket_inodes, tcp_connections


def connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return client, server


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s


@pytest.fixture
def service():
    """A service this process keeps using (etcd, a store): its port is kept."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s


def test_only_the_connections_made_since_the_mark_and_not_to_a_kept_port_are_cut(listener, service):
    before_client, before_server = connected_pair(listener)
    group = GroupSockets()
    group.mark()
    client, server = connected_pair(listener)
    kept_client, kept_server = connected_pair(service)
    keep = frozenset({service.getsockname()[1]})
    try:
        mine = socket_inodes()
        made = group.connections(keep)
        inode = {s: next(i for i, fd in mine.items() if fd == s.fileno()) for s in (client, server, kept_client)}
        # both ends of the new connection are this process's here; the kept service's connection and the older
        # one are not the group's
        assert {inode[client], inode[server]} <= made and inode[kept_client] not in made
        assert {i for i, fd in mine.items() if fd in (before_client.fileno(), before_server.fileno())}.isdisjoint(made)
        assert tcp_connections()[inode[client]].remote_port == listener.getsockname()[1]

        assert group.cut(keep) == len(made) >= 2
        client.settimeout(1)
        assert client.recv(1) == b""  # shut down: a blocked read ends at once
        assert group.connections(keep) == set()  # cut once: the mark is gone
        kept_client.sendall(b"x")
        assert kept_server.recv(1) == b"x"  # the kept service still works
        before_client.sendall(b"y")
        assert before_server.recv(1) == b"y"
    finally:
        for s in (before_client, before_server, client, server, kept_client, kept_server):
            s.close()


def test_nothing_is_cut_without_a_mark(listener):
    client, server = connected_pair(listener)
    try:
        assert GroupSockets().cut(frozenset()) == 0
        client.sendall(b"z")
        assert server.recv(1) == b"z"
    finally:
        client.close()
        server.close()

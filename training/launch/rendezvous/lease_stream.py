"""Lease keep-alives over etcd's own gRPC stream (``etcdserverpb.Lease/LeaseKeepAlive``), preferably to the leader.

Why not the JSON gateway, like every other call of :mod:`.client`: a keep-alive is the one call every agent makes
all the time (every third of its lease's TTL), so its cost, times the number of nodes, is the store's steady
load. Through the gateway each keep-alive is an HTTPS request that the member turns into a new gRPC stream to
itself, and a member that is not the leader forwards it to the leader over its peer connection. Measured here
(``python -m tools.keepalive_cost``: 3 loopback members, 1,024 leases renewed every 0.67 s, each with its own
connections, 2026-11-27): 0.94 ms of the members' CPU per renewal through the gateway (108 % of a core, and
they fell behind), 0.32 ms over one kept-open stream per agent to the leader, 0.57 ms to a follower. A stream
is also what etcd's Go client does.

The messages are a few protobuf fields each way (``LeaseKeepAliveRequest{int64 ID = 1}``;
``LeaseKeepAliveResponse{ResponseHeader header = 1; int64 ID = 2; int64 TTL = 3}``), encoded here: no generated
code, no etcd proto files. A new stream goes to the member that leads (each member's ``maintenance/status`` says
whether it leads, asked over the gateway without a login): when the open one broke (its member went) or none was
open. That lookup runs on a thread of its own and is not given up early: a renewal waits for it at most
:data:`LEADER_STATUS_S`, and a later answer moves the stream at a later renewal (a lookup dropped at its timeout
cost a loaded member one more TLS handshake each time it was asked again). When an answer is only late (a loaded
member, or this host starved), the renewal goes on to the other members in order without asking who leads: asking
costs more calls of a store or host that is already slow. A late member's connection is kept (only the call is
cancelled) and the next stream to it reuses it: a loaded member is not gone, and a new connection would cost it
one more TLS handshake (2026-11-28: in the 1,024-agent simulation, streams re-opened after late answers were part
of a reconnect storm, ~675 new connections a second, that kept the members' accept queues full). The stream asks
again at the next renewal after an answer whose raft term (in its header) is not one in which its member was found
leading: after an election, or when the late path left it on any member, it moves back to the leader (found
2026-11-27: after the leader was stopped and came back, streams stayed on a follower for the rest of the job). TLS
with the client's certificate as for every call; the login token rides along as etcd's ``token`` metadata (etcd
3.5 does not check it for keep-alives: a client certificate is what lets a client renew a lease).
:meth:`.client.EtcdClient.keep_alive` is the way in:

    stream = LeaseKeepAliveStream(endpoints, ca, cert, key, find_leader=client.leader_endpoint,
                                  token=lambda: client._token)
    ttl = stream.renew(lease_id, connect_s=1.0, read_s=2.0)   # 0: the lease is gone
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Callable

METHOD = "/etcdserverpb.Lease/LeaseKeepAlive"
#: Seconds a renewal with no stream open waits for the answer to who leads before it opens one elsewhere (a member
#: answers a status in milliseconds; one slower than this is no member to prefer).
LEADER_STATUS_S = 0.5
#: Seconds the lookup of who leads may take: it runs in the background, and a late answer is used at a later
#: renewal (the stream moves then). Giving up on it sooner saves no renewal anything and costs a loaded member a
#: TLS handshake per lookup: urllib3 drops a timed-out call's connection, so the next lookup connects afresh
#: (2026-11-28, 512 simulated agents: a quarter of the agents' network samples were lookups connecting, with
#: the renewal waiting on them).
LEADER_LOOKUP_S = 3.0
#: Seconds before a stream whose member is not known to lead asks again who leads, when no member said so in time
#: (a member stopped, an election under way): asking at every renewal would add a status call of every member to
#: each renewal while the store is busy electing.
LEADER_RECHECK_S = 5.0
#: Seconds the event loop may take to make a stream's channel (it does not connect: that is the first renewal's).
OPEN_S = 5.0


class KeepAliveFailed(RuntimeError):
    """The member did not answer the keep-alive in time (``late``), or the stream broke (the caller tries
    another)."""

    def __init__(self, message: str, late: bool = False):
        super().__init__(message)
        self.late = late


def encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # protobuf's int64: a negative number is its two's complement, 10 bytes
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated protobuf varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def keep_alive_request(lease: int) -> bytes:
    """``LeaseKeepAliveRequest{ID: lease}`` (field 1, varint)."""
    return b"\x08" + encode_varint(lease)


def _fields(buf: bytes, message: str) -> tuple[dict[int, int], dict[int, bytes]]:
    """A protobuf message's varint fields and length-delimited fields, by field number."""
    varints, nested, i = {}, {}, 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            varints[number], i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            nested[number], i = buf[i : i + length], i + length
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} in a {message}")
    return varints, nested


def keep_alive_response(buf: bytes) -> tuple[int, int, int]:
    """(ID, TTL, raft term) of a ``LeaseKeepAliveResponse``; an absent field is 0 (a TTL of 0: the lease is
    gone). The raft term is its header's (``ResponseHeader{... uint64 raft_term = 4}``): it grows with every
    election, which is how a stream finds out that its member may no longer lead."""
    varints, nested = _fields(buf, "LeaseKeepAliveResponse")
    header, _ = _fields(nested.get(1, b""), "ResponseHeader")
    signed = lambda v: v - (1 << 64) if v >= 1 << 63 else v  # noqa: E731 - int64 from its varint
    return signed(varints.get(2, 0)), signed(varints.get(3, 0)), header.get(4, 0)


class _EventLoop:
    """The one asyncio loop (its own thread) that every keep-alive stream of this process runs on: a stream then
    costs no thread of its own (grpc's blocking API spends three per stream, two of them waking several times a
    second: felt when a simulation runs hundreds of agents in a few processes)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="t5f-etcd-keepalive", daemon=True).start()
                cls._loop = loop
            return cls._loop


class _Stream:
    """One open LeaseKeepAlive call (grpc's asyncio API, on :class:`_EventLoop`) on ``channel`` if given (one kept
    from an earlier stream to the same member), else on a new channel of its own; a renewal waits for its answer
    at most its timeout. ``to_leader``: opened to the member found leading; ``leads_in``: the raft term in which
    its member is known to lead (None: not known); ``term``: its last answer's."""

    def __init__(self, endpoint: str, credentials, token: str, to_leader: bool = False, channel=None):
        self.endpoint, self.to_leader = endpoint, to_leader
        self.leads_in: int | None = None
        self.term = 0
        self.ask_again_at = 0.0  # monotonic time before which it does not ask again who leads
        self._loop = _EventLoop.get()
        self._channel, self._call = channel, None
        opening = asyncio.run_coroutine_threadsafe(self._open(credentials, token), self._loop)
        try:  # making a channel does not connect (the first renewal does): this is quick unless the loop is stuck
            opening.result(OPEN_S)
        except concurrent.futures.TimeoutError:
            opening.cancel()  # not opened later behind the caller's back, on a kept channel the caller gets back
            raise KeepAliveFailed(
                f"{endpoint}: the keep-alive event loop did not open a stream in {OPEN_S} s", late=True
            ) from None

    async def _open(self, credentials, token: str) -> None:
        import grpc.aio

        if self._channel is None:
            # its own connection (not grpc's process-wide subchannel pool: one agent, one connection, also when a
            # simulation runs many agents in one process); no proxy from the environment between agent and store
            self._channel = grpc.aio.secure_channel(
                self.endpoint.split("://", 1)[-1],
                credentials,
                options=[("grpc.use_local_subchannel_pool", 1), ("grpc.enable_http_proxy", 0)],
            )
        method = self._channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)
        self._call = method(metadata=(("token", token),) if token else None)

    async def _renew(self, lease: int) -> tuple[int, int]:
        import grpc.aio

        await self._call.write(keep_alive_request(lease))
        while True:
            answer = await self._call.read()
            if answer is grpc.aio.EOF:
                raise KeepAliveFailed(f"{self.endpoint}: the keep-alive stream ended")
            answered, ttl, term = keep_alive_response(answer)
            if answered == lease:  # an answer for a lease this agent held before (it joined again) is skipped
                return ttl, term

    def renew(self, lease: int, read_timeout_s: float) -> int:
        import grpc

        future = asyncio.run_coroutine_threadsafe(self._renew(lease), self._loop)
        try:
            ttl, self.term = future.result(read_timeout_s)
            if self.to_leader and self.leads_in is None:
                self.leads_in = self.term
            return ttl
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KeepAliveFailed(
                f"{self.endpoint}: no keep-alive answer within {read_timeout_s:.1f} s", late=True
            ) from None
        except (grpc.RpcError, asyncio.InvalidStateError, concurrent.futures.CancelledError) as e:
            raise KeepAliveFailed(f"{self.endpoint}: {_rpc_reason(e)}") from None

    async def _close(self, keep_channel: bool) -> None:
        self._call.cancel()
        if not keep_channel:
            await self._channel.close()

    def close(self, keep_channel: bool = False):
        """Cancel the call and, unless ``keep_channel``, close the channel (on the loop; not waited for). Returns
        the channel if kept (for the next stream to this member), else None."""
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._close(keep_channel), self._loop)
        return self._channel if keep_channel else None


def _rpc_reason(e: Exception) -> str:
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        return f"{code().name} {str(details() or '')[-160:]}"
    return f"{type(e).__name__} {str(e)[-160:]}"


class LeaseKeepAliveStream:
    """Renews leases over one kept-open stream (thread-safe; see the module docstring).

    Args:
        endpoints: the members' client URLs, in the order to try them.
        ca, cert, key: PEM paths (the cluster's CA, this client's certificate and key).
        find_leader: given a time limit in seconds, the endpoint that leads now, or None if that cannot be told
            in time (no member answers, none leads).
        token: the client's current login token ("" before any login).
    """

    def __init__(
        self,
        endpoints: list[str],
        ca: str,
        cert: str,
        key: str,
        find_leader: Callable[[float], str | None],
        token: Callable[[], str],
    ):
        import grpc

        with open(ca, "rb") as c, open(key, "rb") as k, open(cert, "rb") as crt:
            self._credentials = grpc.ssl_channel_credentials(c.read(), k.read(), crt.read())
        self._endpoints = endpoints
        self._find_leader, self._token = find_leader, token
        self._stream: _Stream | None = None
        # channels kept after a late answer, by endpoint: a late member is loaded, not gone, and a new channel
        # would cost it one more TLS handshake (a loaded cluster's agents all doing that at once was a reconnect
        # storm that kept 1,024 simulated agents from ever forming a round)
        self._kept: dict[str, object] = {}
        self._lookup: concurrent.futures.Future | None = None  # the lookup of who leads in flight, if any
        self._lock = threading.Lock()

    def renew(self, lease: int, connect_s: float, read_s: float) -> int:
        """Renew ``lease`` once; its TTL (0: gone). Tries the open stream, then the other members (the leader
        first when the stream broke or none was open), for at most twice ``read_s`` in all (what one pass of the
        gateway's calls took when no member answered); raises :class:`KeepAliveFailed` naming every member tried
        when none answered. A stream whose member is not known to lead in the raft term of its last answer (an
        election since, or a stream opened elsewhere after a late answer) asks who leads, and moves there at the
        first renewal after the answer: a follower forwards every renewal to the leader, 1.8 times the members'
        CPU."""
        deadline = time.monotonic() + 2 * read_s
        left = lambda: deadline - time.monotonic()  # noqa: E731
        with self._lock:
            moved_to = self._follow_the_leader()
            errors, tried, late = [], [], False
            if self._stream is not None:
                tried.append(self._stream.endpoint)
                try:
                    return self._stream.renew(lease, read_s)
                except KeepAliveFailed as e:
                    errors.append(str(e))
                    late = e.late
                    self._drop(keep_channel=e.late)
            # a late answer (a loaded member, or this host starved) is no reason to ask every member who leads
            leader = moved_to or (None if late else self._leader_within(min(LEADER_STATUS_S, max(0.05, left()))))
            order = ([leader] if leader else []) + [e for e in self._endpoints if e != leader]
            for endpoint in [e for e in order if e not in tried] + tried:
                if left() <= 0:
                    break
                kept = self._kept.pop(endpoint, None)
                try:
                    self._stream = _Stream(
                        endpoint, self._credentials, self._token(), to_leader=endpoint == leader, channel=kept
                    )
                except KeepAliveFailed as e:  # the event loop was stuck: the kept channel stays kept
                    errors.append(str(e))
                    if kept is not None:
                        self._kept[endpoint] = kept
                    continue
                try:
                    return self._stream.renew(lease, max(0.05, min(connect_s + read_s, left())))
                except KeepAliveFailed as e:
                    errors.append(str(e))
                    self._drop(keep_channel=e.late)
            raise KeepAliveFailed("; ".join(errors))

    def _ask_who_leads(self) -> concurrent.futures.Future:
        """The lookup of who leads in flight, started (on a thread of its own, :data:`LEADER_LOOKUP_S` at most)
        if none is."""
        if self._lookup is None:
            answer: concurrent.futures.Future = concurrent.futures.Future()

            def look() -> None:
                try:
                    answer.set_result(self._find_leader(LEADER_LOOKUP_S))
                except Exception:  # noqa: BLE001 - no answer is "not known", as a member's silence is
                    answer.set_result(None)

            threading.Thread(target=look, name="t5f-etcd-leader", daemon=True).start()
            self._lookup = answer
        return self._lookup

    def _answer_of_lookup(self, wait_s: float = 0.0) -> tuple[bool, str | None]:
        """(whether the lookup in flight answered within ``wait_s``, its answer); an answer is taken once."""
        lookup = self._lookup
        if lookup is None:
            return False, None
        try:
            leader = lookup.result(wait_s)
        except concurrent.futures.TimeoutError:
            return False, None  # it goes on: a later renewal takes its answer
        self._lookup = None
        return True, leader

    def _leader_within(self, wait_s: float) -> str | None:
        """Who leads, if the lookup (started now unless one is in flight) answers within ``wait_s``."""
        self._ask_who_leads()
        return self._answer_of_lookup(wait_s)[1]

    def _follow_the_leader(self) -> str | None:
        """Before a renewal: if the open stream's member is not known to lead in its last answer's term, ask who
        leads, without waiting: the renewal goes over the open stream, and the first renewal after the answer
        closes the stream if another member leads and returns that member (the renewal opens a stream there),
        else None. If no member says it leads, it asks again after :data:`LEADER_RECHECK_S`."""
        stream = self._stream
        if stream is None or stream.leads_in == stream.term:
            return None
        answered, leader = self._answer_of_lookup()
        if not answered:
            if self._lookup is None and time.monotonic() >= stream.ask_again_at:
                self._ask_who_leads()
            return None
        if leader is None:  # none said so in time: ask again later
            stream.ask_again_at = time.monotonic() + LEADER_RECHECK_S
            return None
        if leader == stream.endpoint:
            stream.leads_in = stream.term
            return None
        self._drop()
        return leader

    def _drop(self, keep_channel: bool = False) -> None:
        """End the open stream; ``keep_channel`` (after a late answer): its connection stays for the next stream
        to that member, else it is closed (the stream broke, or it moves to the leader)."""
        if self._stream is not None:
            channel = self._stream.close(keep_channel)
            if channel is not None:  # none is kept for its member meanwhile: the stream took it when it opened
                self._kept[self._stream.endpoint] = channel
            self._stream = None

    def close(self) -> None:
        with self._lock:
            self._drop()
            kept, self._kept = self._kept, {}
            for channel in kept.values():
                _close_channel(channel, _EventLoop.get())


def _close_channel(channel, loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_closed():
        asyncio.run_coroutine_threadsafe(channel.close(), loop)

"""Lease keep-alives over etcd's gRPC stream (training/launch/rendezvous/lease_stream.py), against a real 3-member
etcd with TLS and auth: the hand-encoded messages, the stream going to the leader, surviving the leader's SIGKILL,
a gone lease, and a store that does not answer at all (bounded, naming the members)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from training.launch.rendezvous.client import EtcdClient, StoreUnavailable
from training.launch.rendezvous.lease_stream import (
    LEADER_LOOKUP_S,
    LeaseKeepAliveStream,
    encode_varint,
    keep_alive_request,
    keep_alive_response,
)


def test_the_messages_are_protobuf():
    assert encode_varint(1) == b"\x01" and encode_varint(300) == b"\xac\x02"
    assert keep_alive_request(300) == b"\x08\xac\x02"
    assert len(encode_varint(-1)) == 10  # int64 two's complement, as protobuf writes it
    header = b"\x0a\x06\x08\x01\x10\x02\x20\x07"  # field 1: ResponseHeader{cluster 1, member 2, raft_term 7}
    assert keep_alive_response(header + b"\x10\xac\x02\x18\x03") == (300, 3, 7)
    assert keep_alive_response(header + b"\x10\xac\x02") == (300, 0, 7)  # no TTL field: the lease is gone
    assert keep_alive_response(b"\x10\xac\x02\x18\x03") == (300, 3, 0)  # no header: term 0
    with pytest.raises(ValueError, match="truncated"):
        keep_alive_response(b"\x10\xac")


def test_a_keep_alive_renews_over_a_stream_to_the_leader(etcd):
    client = EtcdClient(etcd.add_job_user("ka"))
    lease = client.grant(2)
    client.put(client.key("member"), "x", lease=lease)
    assert client.keep_alive(lease) == 2
    assert client._keep_alive_stream._stream.endpoint == etcd.leader().client_url
    assert client.keep_alive(lease + 1) == 0  # no such lease: gone, not an error
    for _ in range(5):  # renewed past its TTL: the member key is still there
        time.sleep(2 / 3)
        assert client.keep_alive(lease) == 2
    assert client.get(client.key("member")).value == "x"
    client.close()


def test_the_leaders_sigkill_costs_the_lease_nothing(etcd):
    client = EtcdClient(etcd.add_job_user("kill"))
    lease = client.grant(2)
    client.put(client.key("member"), "x", lease=lease)
    client.keep_alive(lease)
    old = etcd.leader()
    etcd.kill(old)  # the stream's member
    renewed = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:  # renewing as the agent does, every third of the TTL
        try:
            renewed.append(client.keep_alive(lease))
        except StoreUnavailable:
            renewed.append(None)
        time.sleep(2 / 3)
    assert renewed[-3:] == [2, 2, 2], renewed
    assert client._keep_alive_stream._stream.endpoint != old.client_url
    assert client.get(client.key("member")) is not None, "the lease expired during the election"
    client.close()
    etcd.restart(old)  # three members again for the next test
    etcd.wait_healthy()


def test_after_the_leader_hands_over_the_stream_follows_it(etcd):
    """The leader stays up and hands its leadership to another member (as on SIGTERM or a rolling update): the
    open stream does not break, and without a check it would go on through a follower for the rest of the job."""
    client = EtcdClient(etcd.add_job_user("handover"))
    lease = client.grant(2)
    assert client.keep_alive(lease) == 2
    old = etcd.leader()
    assert client._keep_alive_stream._stream.endpoint == old.client_url
    new = next(m for m in etcd.members if m is not old and m.process.poll() is None)
    root = EtcdClient(replace(etcd.root_credentials(), endpoints=(old.client_url,)))
    root.post("maintenance/transfer-leadership", {"targetID": etcd.status(new)["header"]["member_id"]})
    assert etcd.leader_within(5) is new
    for _ in range(4):  # as the agent renews: the first answer after the election carries the new raft term, the
        assert client.keep_alive(lease) == 2  # next renewal asks who leads, and the one after the answer moves
        time.sleep(2 / 3)
    assert client._keep_alive_stream._stream.endpoint == new.client_url, "the stream stayed on a follower"
    client.close()


def test_no_member_answering_is_store_unavailable_within_its_bound(etcd):
    client = EtcdClient(etcd.add_job_user("silent"))
    lease = client.grant(10)
    client.keep_alive(lease)
    try:
        states = etcd.pause()  # returns once the kernel shows every member stopped (a member still stopping answers)
        assert set(states.values()) == {"T"}, states
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no etcd member answered the keep-alive") as e:
            ttl = client.keep_alive(lease)
            stream = client._keep_alive_stream._stream
            pytest.fail(
                f"renewed (TTL {ttl}) over {stream.endpoint if stream else None} with every member "
                f"stopped: {etcd.process_states()}"
            )
        took = time.monotonic() - started
    finally:
        etcd.resume()
    assert took < 5, took  # twice the read timeout, then the handler says "unreachable" and keeps trying
    assert sum(m.client_url in str(e.value) for m in etcd.members) >= 2, str(e.value)  # the members it tried
    assert client.keep_alive(lease) == 10  # back: the next renewal opens a new stream
    client.close()


def _renewed_late_everywhere(etcd, user: str, ttl_s: int):
    """A client whose lease renewal was late on every member (all stopped, then resumed): (client, lease, the
    channel its stream had before), asserted kept rather than closed."""
    client = EtcdClient(etcd.add_job_user(user))
    lease = client.grant(ttl_s)
    client.keep_alive(lease)
    keep_alive = client._keep_alive_stream
    before = keep_alive._stream._channel
    try:
        assert set(etcd.pause().values()) == {"T"}
        with pytest.raises(StoreUnavailable, match="no keep-alive answer within"):
            client.keep_alive(lease)
        kept = list(keep_alive._kept.values())
    finally:
        etcd.resume()
    assert any(channel is before for channel in kept), "the late member's connection was closed"
    return client, lease, before


def test_a_late_member_keeps_its_connection_for_the_next_stream(etcd):
    """A member that answers late is loaded, not gone: only the call is cancelled, and the next stream to that
    member goes over the same connection (a new one would cost the loaded member one more TLS handshake, and a
    loaded cluster's agents all doing that at once was a reconnect storm). Every member stopped: the renewal is
    late everywhere; once they are back, it goes over the connection the stream had before."""
    client, lease, before = _renewed_late_everywhere(etcd, "late", ttl_s=10)
    keep_alive = client._keep_alive_stream
    assert client.keep_alive(lease) == 10
    assert keep_alive._stream._channel is before, "the stream after the late answers opened a new connection"
    client.close()
    assert keep_alive._kept == {}


def test_a_slow_answer_to_who_leads_is_waited_for_off_the_renewals_path(etcd):
    """A loaded member answers its status after 1.5 s, past the 0.5 s a renewal waits for it: the lookup goes on
    in the background, the renewals go over a follower meanwhile, and the stream moves to the leader once the
    answer is in, after one lookup. A lookup given up at its timeout would never see the answer, and asking again
    would cost the loaded member a new TLS connection each time."""
    leader = etcd.leader()
    followers = tuple(m.client_url for m in etcd.members if m is not leader)
    client = EtcdClient(replace(etcd.add_job_user("slowleader"), endpoints=followers + (leader.client_url,)))
    asked = []

    def loaded_status(timeout_s: float) -> str | None:
        asked.append(timeout_s)
        if timeout_s < 1.5:
            time.sleep(timeout_s)  # no answer within its time
            return None
        time.sleep(1.5)
        return client.leader_endpoint(timeout_s - 1.5)

    lease = client.grant(10)
    stream = LeaseKeepAliveStream(
        list(client.creds.endpoints),
        client.creds.ca,
        client.creds.cert,
        client.creds.key,
        find_leader=loaded_status,
        token=lambda: client._token,
    )
    on = []
    for _ in range(8):
        assert stream.renew(lease, connect_s=1.0, read_s=2.0) == 10
        on.append(stream._stream.endpoint)
        time.sleep(0.5)
    assert on[0] == followers[0], on  # the first stream did not wait for the answer
    assert on[-1] == leader.client_url, f"the stream never reached the leader: {on}, lookups {asked}"
    assert asked == [LEADER_LOOKUP_S], asked  # one lookup, given its full time
    stream.close()
    client.close()


def test_a_stuck_event_loop_does_not_lose_a_kept_connection(etcd):
    """The keep-alive event loop stuck past OPEN_S (a starved host) while a renewal opens a stream on a member's
    kept connection: the renewal fails, and the connection stays kept (before, it was dropped without being
    closed); once the loop runs again, the next stream goes over it."""
    from training.launch.rendezvous.lease_stream import OPEN_S, _EventLoop

    client, lease, before = _renewed_late_everywhere(etcd, "stuckloop", ttl_s=30)
    keep_alive = client._keep_alive_stream
    kept = dict(keep_alive._kept)
    _EventLoop.get().call_soon_threadsafe(time.sleep, OPEN_S + 1.5)  # the loop is stuck from now on
    with pytest.raises(StoreUnavailable, match="did not open a stream"):
        client.keep_alive(lease)
    assert keep_alive._kept == kept and all(keep_alive._kept[e] is c for e, c in kept.items()), (
        "a kept connection was lost while the loop was stuck"
    )
    time.sleep(2)  # the loop runs again
    assert client.keep_alive(lease) == 30
    assert keep_alive._stream._channel is before, "the stream after the stuck loop opened a new connection"
    client.close()

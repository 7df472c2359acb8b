"""Membership on etcd (training/launch/rendezvous) against a real 3-member etcd with TLS and auth: who gets in
(no certificate, wrong password, another job's prefix), leases and tokens, slow and failing members, rounds
formed and re-formed by real handlers in this process. The decisions alone are the unit tier's file of this
name; faults injected into running jobs, the e2e tier's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
import requests

from tests.conftest import ROOT
from training.launch.config import ETCD_MIN_LEASE_S, LaunchError
from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient, StoreRefused, StoreUnavailable, token_lifetime_s
from training.launch.rendezvous.handler import EtcdRendezvousHandler, put_round
from cluster_facts.versions import BCRYPT_COST
from training.launch.rendezvous.members import LocalEtcd


# ---------------------------------------------------------------------------------------------- who gets in
def test_a_job_reads_and_writes_its_own_prefix_only(etcd):
    mine, other = etcd.add_job_user("mine"), etcd.add_job_user("theirs")
    client = EtcdClient(mine)
    client.put(client.key("x"), "1")
    assert client.get(client.key("x")).value == "1"
    with pytest.raises(StoreRefused, match="permission denied"):
        client.put(other.prefix + "x", "1")
    with pytest.raises(StoreRefused, match="permission denied"):
        client.get(other.prefix + "x")


def test_etcd_raises_a_lease_shorter_than_the_launchers_floor_to_it(etcd):
    """The launcher refuses keep-alives under ETCD_MIN_LEASE_S on etcd: the members would grant that much anyway
    (1.5 x their election timeout, rounded up), so a shorter setting would only mislead its own messages."""
    client = EtcdClient(etcd.add_job_user("ttl"))
    assert int(client.post("lease/grant", {"TTL": "1"})["TTL"]) == ETCD_MIN_LEASE_S
    assert int(client.post("lease/grant", {"TTL": str(ETCD_MIN_LEASE_S)})["TTL"]) == ETCD_MIN_LEASE_S


def test_a_client_without_a_certificate_or_the_password_is_refused(etcd, tmp_path):
    creds = etcd.add_job_user("pw")
    with pytest.raises(requests.exceptions.SSLError):  # the members require a certificate the CA signed
        requests.post(f"{creds.endpoints[0]}/v3/kv/range", json={"key": "eA=="}, verify=creds.ca, timeout=5)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    with pytest.raises(StoreRefused, match="could not log in"):
        EtcdClient(replace(creds, password_file=str(wrong))).get(creds.prefix + "x")


def test_passwords_are_random_secrets_hashed_at_the_cheapest_cost(etcd):
    """The members hash passwords at bcrypt's least cost (cluster_facts.versions.BCRYPT_COST: a login is then
    ~1 ms of a member's CPU, not ~85 ms), which is safe only because no password is one a person chose: each
    job's is a random secret of 144 bits, and the login with it works."""
    assert all(m.argv[m.argv.index("--bcrypt-cost") + 1] == str(BCRYPT_COST) for m in etcd.members)
    creds = etcd.add_job_user("cheap-hash")
    with open(creds.password_file) as f:
        password = f.read().strip()
    assert len(password) >= 32 and len(set(password)) > 16  # token_urlsafe(24): 32 characters, 6 random bits each
    client = EtcdClient(creds)
    client.put(client.key("x"), "1")
    assert client.get(client.key("x")).value == "1"


def test_a_client_logs_in_again_before_its_token_expires_off_its_calls_path(tmp_path):
    """Tokens last 10 minutes; a job's agents log in together, so without renewal every agent's first call after
    that (a re-formation's) would wait for its login, N logins at once. The client logs in again in the
    background during the token's last quarter: with 6 s tokens, a call every 0.5 s for 12 s never logs in on
    its own thread, and the token changes before the first one expires. Without the background login the calls
    after 6 s log in themselves (the member calls the token expired)."""
    with LocalEtcd.start(str(tmp_path / "etcd"), token_ttl_s=6) as cluster:
        client = EtcdClient(cluster.add_job_user("renew"))
        logins: list[str] = []
        log_in = client._authenticate

        def counted(url: str) -> None:
            logins.append(threading.current_thread().name)
            log_in(url)

        client._authenticate = counted
        try:
            client.put(client.key("x"), "1")
            first = client._token
            lifetime = token_lifetime_s(first)
            assert lifetime is not None and 4 < lifetime <= 6
            tokens = {first}
            end = time.monotonic() + 12
            while time.monotonic() < end:
                assert client.get(client.key("x")).value == "1"
                tokens.add(client._token)
                time.sleep(0.5)
        finally:
            client.close()
        assert logins[0] == threading.current_thread().name  # the first login is the first call's
        assert len(tokens) >= 3, f"the token was not renewed in time: {len(tokens)} tokens in 12 s of 6 s tokens"
        assert set(logins[1:]) == {"t5f-etcd-login"}, f"a call logged in on its own path: {logins}"


def test_a_client_waits_longer_only_when_every_member_is_slow(etcd):
    """One member that does not answer is taken for gone and the next tried at once; every member slow is a
    loaded store, where giving up early only comes back sooner with a new TLS connection for the members to
    handshake. So a pass in which every member timed out doubles the next pass's timeouts (up to 4 times), a
    member refusing the connection (gone, not slow) does not, and any answer sets them back."""
    creds = etcd.add_job_user("patience")
    # Half the default call timeouts (REQUEST_TIMEOUT_S, 1 s connect and 2 s read): the same doubling in half the
    # waiting (the three timed-out passes are most of this test's time).
    connect = 0.5
    client = EtcdClient(creds, request_timeout_s=(connect, 2 * connect))
    client.put(client.key("x"), "1")
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        closed = f"https://127.0.0.1:{s.getsockname()[1]}"
    refusing = EtcdClient(replace(creds, endpoints=(closed,)))
    with pytest.raises(StoreUnavailable, match="NewConnectionError"):
        refusing.get(creds.prefix + "x")
    assert refusing._patience == 1.0
    took = []
    try:
        assert set(etcd.pause().values()) == {"T"}  # fault: every member slow (stopped, its sockets open)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="timed out"):
                client.get(client.key("x"))
            took.append(time.monotonic() - started)
    finally:
        etcd.resume()
    assert client._patience == 4.0
    # each pass: three members' connects (`connect` each, then twice, then 4 times that); only lower bounds, a
    # loaded machine adds
    assert took[1] >= 0.95 * 3 * 2 * connect and took[2] >= 0.95 * 3 * 4 * connect, took
    assert client.get(client.key("x")).value == "1"
    assert client._patience == 1.0


class _FakeMember:
    """A TLS server with the cluster's CA that answers every call with one status and etcd error, as a member in
    trouble does (a member cannot be made to say it on cue); ``said``: the paths it was asked."""

    def __init__(self, etcd, tmp_path, status: int, error: str):
        import http.server
        import json
        import ssl

        said = self.said = []
        body = json.dumps({"error": error, "code": 14 if status == 503 else 2, "message": error}).encode()

        class Answer(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                said.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        cert = etcd.ca.issue(f"fake-{status}", str(tmp_path), hosts=["127.0.0.1"])
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert.cert, cert.key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "_FakeMember":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()


def test_a_member_that_could_not_finish_a_call_in_time_is_a_slow_member_not_a_refusal(etcd, tmp_path):
    """A loaded member that took a call but could not finish it in time answers HTTP 500 with etcd's
    ``context deadline exceeded`` (seen on a lease grant at 1,024 simulated agents, where it ended the agent as a
    refusal). It is a slow member: the client goes on to the next one, and counts it toward its patience. The
    first endpoint here says exactly that to every call; the real members follow."""
    with _FakeMember(etcd, tmp_path, 500, "context deadline exceeded") as slow_member:
        slow, said = slow_member.url, slow_member.said
        creds = etcd.add_job_user("too-slow")
        client = EtcdClient(replace(creds, endpoints=(slow,) + tuple(creds.endpoints)))
        client._endpoints = [slow] + list(creds.endpoints)  # the slow one first (the client shuffles them)
        logged_in = EtcdClient(creds)
        logged_in.get(logged_in.key("x"))  # a login at a real member (the slow one would not let it)
        client._token = logged_in._token
        lease = client.grant(5)  # the call that ended an agent: now answered by the next member
        assert lease > 0 and said == ["/v3/lease/grant"]
        only_slow = EtcdClient(replace(creds, endpoints=(slow,)))
        only_slow._token = client._token
        with pytest.raises(StoreUnavailable, match="context deadline exceeded"):
            only_slow.grant(5)
        assert only_slow._patience == 2.0  # every member it has timed out: wait longer next time


def test_a_login_during_a_leader_change_is_a_member_that_cannot_serve_not_wrong_credentials(etcd, tmp_path):
    """A member that answers the login with HTTP 503 ``etcdserver: leader changed`` (the leader was just
    SIGKILLed) cannot serve now; another member can. Before, the login's answer was a refusal: the Slurm lab's
    spare, starting as the leader was killed, ended with exit 2 'check T5_ETCD_USER, T5_ETCD_PASSWORD_FILE' and
    srun took the job down (a requeue). Now the client logs in at the next member; with no other member it is an
    outage, which the start check waits out instead of naming the credentials."""
    from training.launch.rendezvous.start import StartRefused, check_start

    with _FakeMember(etcd, tmp_path, 503, "etcdserver: leader changed") as electing:
        creds = etcd.add_job_user("electing")
        client = EtcdClient(replace(creds, endpoints=(electing.url,) + tuple(creds.endpoints)))
        client._endpoints = [electing.url] + list(creds.endpoints)  # the electing one first
        assert client.get(client.key("x")) is None  # logged in at a real member, read there
        assert electing.said == ["/v3/auth/authenticate"]
        only = EtcdClient(replace(creds, endpoints=(electing.url,)))
        with pytest.raises(StoreUnavailable, match="leader changed"):
            only.get(only.key("x"))
        env = {**creds.as_env(), "T5_ETCD_ENDPOINTS": electing.url}
        with pytest.raises(StartRefused) as refused:
            check_start("electing", "job e", {"join_timeout": "2", "first_contact_timeout": "1"}, env=env)
        assert refused.value.code == 1 and "never served this agent within the join timeout" in str(refused.value)
        assert "T5_ETCD_USER" not in str(refused.value)


def test_a_member_whose_port_is_taken_at_start_gets_a_fresh_one(tmp_path, monkeypatch):
    """Another process can bind a member's port between the choice and etcd's bind (CI lost a member that way):
    the cluster starts again on fresh ports instead of failing the caller."""
    from training.launch.rendezvous import members

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    offered = iter([taken])
    real_free_port = members._free_port
    monkeypatch.setattr(members, "_free_port", lambda host, chosen: next(offered, None) or real_free_port(host, chosen))
    try:
        with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
            assert taken not in {int(url.rsplit(":", 1)[1]) for url in cluster.endpoints}
            assert cluster.leader() is not None
    finally:
        squatter.close()
    assert b"address already in use" in (tmp_path / "etcd" / "etcd.log").read_bytes()


def _ports(cluster: LocalEtcd) -> list[int]:
    return [int(url.rsplit(":", 1)[1]) for m in cluster.members for url in (m.client_url, m.peer_url)]


def test_members_are_never_drawn_the_same_port(tmp_path, monkeypatch):
    """Two members drawn the same peer port made etcd refuse the whole cluster ("initial cluster ... has duplicate
    url"; every member exited with 1, and a fresh start followed only if a member also happened to log a bind
    failure). The draw here offers one free port six times over: the cluster starts on its first attempt, each
    member on ports of its own."""
    from training.launch.rendezvous import members

    port = members._free_port("127.0.0.1", set())
    draws = iter([port] * 6)
    real_choice = members._PORT_RNG.choice
    monkeypatch.setattr(members._PORT_RNG, "choice", lambda seq: next(draws, None) or real_choice(seq))
    monkeypatch.setattr(members, "START_ATTEMPTS", 1)
    with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
        ports = _ports(cluster)
        assert port in ports and len(set(ports)) == 6, ports
        assert cluster.leader() is not None


def test_a_member_that_exits_at_start_says_why_in_the_error(tmp_path, monkeypatch):
    """A member that exits while the cluster starts: the caller's error carries etcd's own reason (a CI log shows
    the error, not the members' log file). Two members are given one peer port here, which etcd refuses: as a
    duplicate URL in the cluster's list, or, when the other member has bound it first (a loaded machine, seen in
    CI), as that port already in use."""
    from training.launch.rendezvous import members

    real_free_port = members._free_port
    monkeypatch.setattr(members, "START_ATTEMPTS", 1)
    for attempt in range(3):  # a port another process takes between the draw and etcd's bind is another refusal
        port = real_free_port("127.0.0.1", set())
        peers = iter([None, port, None, port])  # m0's client, m0's peer, m1's client, m1's peer
        monkeypatch.setattr(
            members, "_free_port", lambda host, chosen, peers=peers: next(peers, None) or real_free_port(host, chosen)
        )
        with pytest.raises(LaunchError) as refused:
            LocalEtcd.start(str(tmp_path / f"etcd{attempt}"))
        said = str(refused.value)
        if "has duplicate url" in said or f"listen tcp 127.0.0.1:{port}: bind: address already in use" in said:
            break  # else another port was taken by another process between the draw and etcd's bind: again
    assert f"127.0.0.1:{port}" in said, said
    assert "has duplicate url" in said or "bind: address already in use" in said, said
    assert str(tmp_path / f"etcd{attempt}" / "etcd.log") in str(refused.value)


def _agents(run_id: str, creds, n: int, *, min_nodes: int, max_nodes: int, **kw) -> list[EtcdRendezvousHandler]:
    """``n`` real agents of job ``run_id`` on loopback: a 2 s lease, a 1 s last call, 30 s to join (``kw``: others)."""
    timings = {"ttl_s": 2, "last_call_s": 1, "join_timeout_s": 30, "local_addr": "127.0.0.1"} | kw
    return [
        EtcdRendezvousHandler(run_id, EtcdClient(creds), min_nodes=min_nodes, max_nodes=max_nodes, **timings)
        for _ in range(n)
    ]


def test_the_largest_round_forms_in_one_transaction_and_one_page_more_is_refused(etcd):
    """A round's seat pages are written in the transaction that forms it: MAX_ROUND_NODES participants fit in
    etcd's operations per transaction, one page more is refused (the launcher refuses such a --nodes first).
    Member ids as long as a pod's (``<40-character hostname>-<pid>-<6 hex>``): the bytes fit as well."""
    client = EtcdClient(etcd.add_job_user("big"))
    prefix = client.key("rdzv/big/")

    def formed(n_nodes: int, n: int) -> rounds.Round:
        ids = [f"{'trainjob-t5-large-node-0-7f9c4d5b6-x2k4q':<40}-{100000 + i}-{i:06x}" for i in range(n_nodes)]
        return rounds.formed(rounds.Round(n=n, prev=ids), ids)

    assert put_round(client, prefix, 0, formed(rounds.MAX_ROUND_NODES, 0), seats=True)
    stored = client.get(prefix + "round")
    assert len(rounds.Round.loads(stored.value).participants) == rounds.MAX_ROUND_NODES
    assert len(client.get_prefix(prefix + "seats/")[0]) == rounds.page_count(rounds.MAX_ROUND_NODES) == 125
    with pytest.raises(StoreRefused, match="too many operations in txn request"):
        put_round(client, prefix, stored.mod_revision, formed(rounds.MAX_ROUND_NODES + 1, 1), seats=True)


def test_a_round_is_formed_with_its_rank_0_store_in_one_write_and_every_agent_uses_it(etcd):
    """The closer writes rank 0's store address into the transaction that forms the round: the record changes
    twice (opened, formed), with no third write to publish a store, and both agents get the same store (a key
    one sets, the other reads) under the round's own prefix."""
    from concurrent.futures import ThreadPoolExecutor

    creds = etcd.add_job_user("formed")
    agents = _agents("formed", creds, 2, min_nodes=2, max_nodes=2)
    try:
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda a: a.next_rendezvous(), agents))
        kv = EtcdClient(creds).get(creds.prefix + "rdzv/formed/round")
        r = rounds.Round.loads(kv.value)
        assert (r.n, r.formed, kv.version) == (0, True, 2), (r, kv.version)
        rank0 = next(a for a, info in zip(agents, infos) if info.rank == 0)
        assert r.store == f"127.0.0.1:{rank0._store_server.port}"
        assert sorted(info.rank for info in infos) == [0, 1]
        infos[0].store.set("hello", "from one agent")
        assert infos[1].store.get("hello") == b"from one agent"
        assert rank0._store_server.get("t5f/round/0/hello") == b"from one agent"  # the round's own prefix
    finally:
        for a in sorted(agents, key=lambda a: a._hosting):  # the host last: it waits for the others to leave
            a.shutdown()


def test_an_agent_whose_rank_0_store_does_not_answer_gives_up_its_place_once_the_round_changed(etcd):
    """Rank 0's node lost right after the round formed: its store does not answer, and a newer round replaces
    the one the agent took a place in. The agent stops trying that store (to join the newer round) instead of
    waiting out the store's 30 s timeout."""
    from training.launch.rendezvous import handler as handler_module

    agent = EtcdRendezvousHandler(
        "gone",
        EtcdClient(etcd.add_job_user("gone")),
        min_nodes=1,
        max_nodes=2,
        ttl_s=2,
        last_call_s=1,
        join_timeout_s=60,
        local_addr="127.0.0.1",
    )
    try:
        with socket.socket() as s:  # a port nothing listens on: the lost rank 0's store
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        # the head shows another round than n=7; without the check it would try until join_timeout_s (60 s) and
        # then raise RendezvousError
        with pytest.raises(handler_module._RoundChanged):
            agent._round_store(rounds.Round(n=7, formed=True, store=f"127.0.0.1:{dead}"))
    finally:
        agent.shutdown()


def test_at_the_end_only_the_first_agent_writes_the_closed_round(etcd):
    """Every agent closes the rendezvous when the job ends: the first writes it, the others find it closed and
    write nothing (each rewriting the whole record was N x its size through etcd's raft log)."""
    creds = etcd.add_job_user("closing")
    agents = [
        EtcdRendezvousHandler(
            "closing", EtcdClient(creds), min_nodes=1, max_nodes=3, ttl_s=2, last_call_s=1, join_timeout_s=10
        )
        for _ in range(3)
    ]
    client = EtcdClient(creds)
    key = client.key("rdzv/closing/round")
    agents[0].shutdown()
    closed = client.get(key)
    assert rounds.Round.loads(closed.value).closed
    for agent in agents[1:]:
        agent.shutdown()
    assert client.get(key).mod_revision == closed.mod_revision


def test_a_leaving_agent_whose_renewal_comes_after_its_revoke_does_not_join_again(etcd, capsys):
    """At a job's end an agent revokes its lease; a keep-alive that its thread sends just after finds the lease
    gone. It must not join again under a new lease (a member key left behind for a lease's TTL, and "lease
    expired; joining again" printed by agents of a job that ended: 56 of 256 simulated agents did)."""
    creds = etcd.add_job_user("leaving")
    agent = EtcdRendezvousHandler(
        "leaving", EtcdClient(creds), min_nodes=1, max_nodes=1, ttl_s=2, last_call_s=1, join_timeout_s=10
    )
    revoke = agent.client.revoke

    def revoke_then_renew(lease):  # the keep-alive thread's renewal lands right after the revoke
        revoke(lease)
        agent._keep_alive_once()

    agent.client.revoke = revoke_then_renew
    agent.shutdown()
    members, _ = EtcdClient(creds).get_prefix(creds.prefix + "rdzv/leaving/members/")
    assert members == [] and "joining again" not in capsys.readouterr().err


def _three_agents_and_the_last_lost(etcd, run_id: str):
    """Three real agents (MIN 1, MAX 3, a 2 s lease) form a round; then the one with the highest rank stops as a
    SIGKILLed node's would (its keep-alives and watch stop, nothing is revoked: its lease expires). Returns the
    job's credentials, the agents, their ranks and the lost one; the caller shuts the others down."""
    from concurrent.futures import ThreadPoolExecutor

    creds = etcd.add_job_user(run_id)
    agents = _agents(run_id, creds, 3, min_nodes=1, max_nodes=3)
    try:
        with ThreadPoolExecutor(3) as pool:
            infos = list(pool.map(lambda a: a.next_rendezvous(), agents))
    except BaseException:
        for a in agents:
            a.shutdown()
        raise
    ranks = {a: info.rank for a, info in zip(agents, infos)}
    lost = max(agents, key=ranks.get)
    lost._stop.set()
    lost.round_view.stop()
    return creds, agents, ranks, lost


def test_a_lost_nodes_round_re_forms_without_a_seat_read_by_the_nodes_that_kept_their_place(etcd):
    """Three real agents form a round; the one with the highest rank stops (its lease expires, as a lost node's
    does). The two others re-form, find their seats in the head (they keep their ranks) and read no seat page;
    before, each read its page."""
    from concurrent.futures import ThreadPoolExecutor

    creds, agents, ranks, lost = _three_agents_and_the_last_lost(etcd, "kept")
    try:
        survivors = [a for a in agents if a is not lost]
        reads: list[str] = []
        for a in survivors:
            get = a.client.get
            a.client.get = lambda key, *args, _get=get, **kw: reads.append(key) or _get(key, *args, **kw)
        deadline = time.monotonic() + 20
        while not all(a.num_nodes_waiting() for a in survivors):  # the lease expired, the closer reopened
            assert time.monotonic() < deadline, "the lost node's round was not replaced"
            time.sleep(0.1)
        with ThreadPoolExecutor(2) as pool:
            again = list(pool.map(lambda a: a.next_rendezvous(), survivors))
        assert [(info.rank, info.world_size) for info in again] == [(ranks[a], 2) for a in survivors]
        assert [k for k in reads if "/seats/" in k] == [], reads
        head = rounds.Head.loads(EtcdClient(creds).get(creds.prefix + "rdzv/kept/head").value)
        assert head.n == 1 and head.formed and head.moved == {lost.me: -1}
    finally:
        for a in sorted((a for a in agents if a is not lost), key=lambda a: a._hosting):
            a.shutdown()


def test_a_survivor_that_never_comes_for_its_place_is_left_out_as_stuck(etcd, monkeypatch, capsys):
    """Three real agents form a round; the highest rank is lost. The closer forms the next round at once from
    the two survivors (no joins). One of them never comes for its place (alive: its keep-alives go on, as an
    agent blocked on a worker that cannot be killed): once the window ends (shortened here from 33 s), the
    round is replaced by one without it, and the other survivor says why and gets a place of one. Without the
    rule the other survivor's workers would wait for the stuck node's forever."""
    # a window of 1 + 4 s: long enough for the survivor that comes to confirm on a loaded machine
    monkeypatch.setattr(rounds, "STOPPING_WORKERS_S", 4.0)
    creds, agents, ranks, lost = _three_agents_and_the_last_lost(etcd, "stuck")
    try:
        good, stuck = sorted((a for a in agents if a is not lost), key=ranks.get)

        def wait_for_round(n: int, timeout_s: float) -> rounds.Round:
            deadline = time.monotonic() + timeout_s
            while True:
                kv = EtcdClient(creds).get(creds.prefix + "rdzv/stuck/round")
                r = rounds.Round.loads(kv.value)
                if r.n >= n and good.num_nodes_waiting():
                    return r
                assert time.monotonic() < deadline, f"no round {n} within {timeout_s} s: {r}"
                time.sleep(0.1)

        r = wait_for_round(1, 20)
        assert (r.n, r.formed, r.participants, r.lost) == (1, True, [good.me, stuck.me], [lost.me])
        assert r.presumed_at is not None  # formed at once, from the live members: nobody joined it
        info = good.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 2)
        r = wait_for_round(2, 25)  # the stuck one never called next_rendezvous
        assert (r.n, r.formed, r.participants, r.lost, r.stuck) == (2, True, [good.me], [stuck.me], [stuck.me])
        info = good.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        err = capsys.readouterr().err
        assert f"lost node(s) of round 1: {stuck.me} (alive but did not take its place within 5 s: stuck)" in err
    finally:
        for a in sorted((a for a in agents if a is not lost), key=lambda a: a._hosting):
            a.shutdown()


def test_an_in_place_survivor_whose_store_read_fails_takes_its_place_at_the_next_look(etcd, capsys):
    """An in-place job of 2 nodes and a hot spare (real agents); the node of rank 1 is lost (its lease expires).
    The round that replaces it with the spare keeps rank 0's workers (its scope); rank 0's agent's first look at it
    finds the store away (one read raises StoreUnavailable, as a slow etcd under load gives): it answers "no node
    waiting", restarts nothing, and takes its place at the next look. Before, that first failed read answered
    "a node waiting", and torchrun restarted every worker of the job."""
    from concurrent.futures import ThreadPoolExecutor

    creds = etcd.add_job_user("slowread")
    agents = _agents("slowread", creds, 3, min_nodes=2, max_nodes=2, in_place=True)
    pool, lost = ThreadPoolExecutor(3), None
    try:
        calls = {a: pool.submit(a.next_rendezvous) for a in agents}
        deadline = time.monotonic() + 30
        while sum(c.done() for c in calls.values()) < 2:
            assert time.monotonic() < deadline, "round 0 did not form"
            time.sleep(0.05)
        ranks = {a: c.result().rank for a, c in calls.items() if c.done()}
        (spare,) = [a for a in agents if a not in ranks]
        survivor, lost = sorted(ranks, key=ranks.get)
        lost._stop.set()  # a SIGKILLed node's agent: keep-alives and watch stop, its lease expires
        lost.round_view.stop()
        assert calls[spare].result(timeout=30).rank == 1  # round 1: the spare in the lost rank
        head = rounds.Head.loads(EtcdClient(creds).get(creds.prefix + "rdzv/slowread/head").value)
        assert head.n == 1 and head.lost == [lost.me] and head.in_place_scope == 0
        read = survivor._head.read
        failures = iter([StoreUnavailable("etcd did not answer in time (injected once)")])

        def read_failing_once(seat):
            for e in failures:
                raise e
            return read(seat)

        survivor._head.read = read_failing_once
        assert survivor.num_nodes_waiting() == 0 and survivor.round.n == 0  # the read failed: nothing restarted
        assert survivor.num_nodes_waiting() == 0 and survivor.round.n == 1  # the next look took the place
        assert "round 1 keeps this node's workers running (in-place recovery, scope 0)" in capsys.readouterr().err
    finally:
        for a in sorted((a for a in agents if a is not lost), key=lambda a: a._hosting):
            a.shutdown()
        pool.shutdown(wait=False)


def test_the_admin_command_gives_a_job_its_own_user(etcd, tmp_path):
    root = etcd.root_credentials()
    env = {**os.environ, **root.as_env(), "T5_ETCD_ROOT_PASSWORD_FILE": root.password_file}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch.rendezvous.admin",
            "add-job",
            "--job",
            "cli",
            "--out",
            str(tmp_path / "creds"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job_env = dict(line.split("=", 1) for line in (tmp_path / "creds" / "job.env").read_text().splitlines())
    assert job_env["T5_ETCD_USER"] == "job-cli" and job_env["T5_ETCD_PREFIX"] == "/t5-failover/jobs/cli/"
    assert (tmp_path / "creds" / "job-cli.password").stat().st_mode & 0o077 == 0
    from training.launch.rendezvous.client import ClientCredentials

    client = EtcdClient(ClientCredentials.from_env(job_env))
    client.put(client.key("k"), "v")
    with pytest.raises(StoreRefused, match="permission denied"):
        client.put("/t5-failover/jobs/other/k", "v")
    env.pop("T5_ETCD_ROOT_PASSWORD_FILE")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch.rendezvous.admin",
            "add-job",
            "--job",
            "x",
            "--out",
            str(tmp_path / "x"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: T5_ETCD_ROOT_PASSWORD_FILE is not set: point it at root's password file"
    )


# ---------------------------------------------------------------------------------------------- a dead agent
def test_a_dead_agents_lease_is_revoked_at_once_a_live_ones_is_left_to_its_ttl(etcd):
    """training.launch.rendezvous.dead_agent: an agent whose store port refuses connections is dead, and its member
    key goes now (its lease revoked) instead of at its TTL; one whose port accepts (alive, or stopped: the socket
    here is never accepted from, as a SIGSTOPped agent's) proves nothing and keeps its lease. member_at names the
    agent at a node rank of the newest formed round only. (A probe that times out, a host gone, is not shown: this
    machine's network refuses connections to unrouted addresses instead of dropping them.)"""
    import json

    from training.launch.rendezvous.dead_agent import member_at, take_out_if_dead

    client = EtcdClient(etcd.add_job_user("dead-agent"))
    prefix = client.key("rdzv/job/")
    listening = socket.create_server(("127.0.0.1", 0))
    freed = socket.create_server(("127.0.0.1", 0))
    stores = {
        "alive": f"127.0.0.1:{listening.getsockname()[1]}",
        "dead": f"127.0.0.1:{freed.getsockname()[1]}",
    }
    freed.close()  # nothing listens there now: what a SIGKILLed agent's port answers
    for member, store in stores.items():
        client.put(prefix + f"members/{member}", json.dumps({"store": store}), lease=client.grant(30))
    put_round(client, prefix, 0, rounds.Round(n=4, formed=True, participants=["alive", "dead"]))
    try:
        assert [member_at(client, prefix, 4, i) for i in range(3)] == ["alive", "dead", ""]
        assert member_at(client, prefix, 3, 1) == ""  # a round that is no longer the newest

        assert take_out_if_dead(client, prefix, "alive") == ""
        assert take_out_if_dead(client, prefix, "dead") == stores["dead"]
        assert take_out_if_dead(client, prefix, "dead") == ""  # gone already
    finally:
        listening.close()
    assert client.get(prefix + "members/dead") is None
    assert client.get(prefix + "members/alive") is not None

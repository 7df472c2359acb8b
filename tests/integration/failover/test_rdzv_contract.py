"""What torch's agent relies on from a ``RendezvousHandler`` (torch's own rendezvous tests,
``test/distributed/elastic/rendezvous/dynamic_rendezvous_test.py`` and ``api_test.py``): each test is a scenario
that once broke the contract, or one of torch's own.

The backend-neutral scenarios (those taking the ``backend`` fixture) run against BOTH torch's ``c10d`` handler
(a ``TCPStore`` on 127.0.0.1) and the project's ``t5-etcd`` handler (a real local 3-member etcd), each built the
way torchrun builds it: ``rendezvous_handler_registry.create_handler(RendezvousParameters(...))`` with the same
``--rdzv-conf`` keys. A torch upgrade that changes the contract then fails the ``c10d`` case here first. Where the
two backends legitimately differ, the test asserts each one's documented behaviour from the :data:`DIFFERS` table
(one row per difference: the value for each backend, and a comment saying why they differ); a scenario that the
two must pass alike asserts one thing for both. A scenario that fails on ``t5-etcd`` only is a contract bug of the
project's handler: it is not weakened but marked for ``t5-etcd`` alone, ``@pytest.mark.parametrize("backend", [C10D,
pytest.param(T5, marks=pytest.mark.xfail(strict=True, reason=...))], indirect=True)``, the reason saying what fails
(none is, today).

The tests without the fixture are ``t5-etcd`` specific (etcd members killed, the round record, the take-out
note, torchrun's exit code on the closed error) and build ``EtcdRendezvousHandler`` directly."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousTimeoutError,
)

from training.launch.rendezvous import handler as handler_module
from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient
from training.launch.rendezvous.handler import EtcdRendezvousHandler
from training.launch.rendezvous.members import LocalEtcd

C10D, T5 = "c10d", "t5-etcd"

#: Where the two handlers legitimately differ: per row, what each backend does (asserted as such), and why.
DIFFERS = {
    # A node beyond MAX stands by (torch's redundancy list); when the job ends, torch ends its next_rendezvous with
    # RendezvousGracefulExitError. t5-etcd raises RendezvousClosedError: torch 2.13's launch_agent fails on the
    # graceful one (exit 1, the agent cannot tell why; see test_canary_no_rendezvous_error_ends_plain_torchrun_with_0)
    # and the project's agent turns the closed error into exit 0.
    "spare_when_the_job_ends": {C10D: RendezvousGracefulExitError, T5: RendezvousClosedError},
    # use_agent_store with TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset: c10d says True (torch's default: the workers
    # share the rendezvous's store, rank 0's handler serves a TCPStore for their bootstrap); t5-etcd always says
    # False: its round store is a prefix on rank 0's own TCPStore, another host each round (the variable set to 1:
    # both False).
    "use_agent_store": {C10D: True, T5: False},
    # The participants of the round before keep their ranks in the next one and late nodes come after them:
    # t5-etcd promises it (the workers' snapshots are where they left them); c10d ranks the sorted node
    # descriptors (address, pid, local id), which keeps them in these tests only by accident: not asserted.
    "keeps_ranks": {C10D: False, T5: True},
    # The name every thread of the handler starts with (c10d: its keep-alive timer, started by next_rendezvous).
    "threads": {C10D: "RendezvousKeepAliveTimer", T5: "t5f-rdzv"},
}

#: The ``--rdzv-conf`` of every handler the ``backend`` fixture builds (each test may override a key): keep-alive
#: 2 s x 3 (t5-etcd: a 6 s lease), a short last call and join timeout. c10d's keys are integers (``get_as_int``).
CONF = dict(
    keep_alive_interval=2,
    keep_alive_max_attempt=3,
    last_call_timeout=1,
    join_timeout=30,
    close_timeout=30,  # c10d's close timed out at 10 s once with 3 test workers on a loaded 2-core machine
    heartbeat_timeout=5,
)


class Backend:
    """Handlers of one rendezvous (``run_id``) on one backend, built through torch's registry as torchrun builds
    them; :meth:`shutdown_all` shuts down every one it built (the round's store host last)."""

    def __init__(self, name: str, run_id: str, monkeypatch, request):
        self.name, self.run_id = name, run_id
        self.handlers: list[RendezvousHandler] = []
        self.down: list[RendezvousHandler] = []
        monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # both: the round's store, not the agent's
        if name == T5:
            handler_module.register()
            monkeypatch.delenv(handler_module.STANDBY_ENV, raising=False)
            monkeypatch.delenv(handler_module.NODE_INDEX_ENV, raising=False)
            self.creds = request.getfixturevalue("etcd").add_job_user(run_id)
            for var, value in self.creds.as_env().items():
                monkeypatch.setenv(var, value)
            self.endpoint = ",".join(self.creds.endpoints)
        else:
            with socket.socket() as s:  # a free port for the TCPStore that the first handler hosts
                s.bind(("127.0.0.1", 0))
                self.endpoint = f"127.0.0.1:{s.getsockname()[1]}"

    def make(self, min_nodes: int, max_nodes: int, **conf) -> RendezvousHandler:
        """One more node's handler; c10d: the first hosts the store (``is_host`` as torchrun infers it on the
        endpoint's host), the others connect to it."""
        extra = {"is_host": not self.handlers} if self.name == C10D else {}
        params = RendezvousParameters(
            self.name,
            self.endpoint,
            self.run_id,
            min_nodes,
            max_nodes,
            local_addr="127.0.0.1",
            **{**CONF, **extra, **conf},
        )
        handler = rendezvous_handler_registry.create_handler(params)
        self.handlers.append(handler)
        return handler

    def shutdown(self, *handlers: RendezvousHandler) -> list[bool]:
        """``shutdown()`` of each handler not shut down yet (t5-etcd: the round's store host last), what each said."""
        todo = [h for h in handlers if all(h is not d for d in self.down)]
        self.down += todo
        said, errors = [], []
        for h in sorted(todo, key=lambda h: getattr(h, "_hosting", False)):
            try:
                said.append(h.shutdown())
            except Exception as e:  # noqa: BLE001 - the others are shut down all the same, then it is raised
                said.append(None)
                errors.append(e)
        if errors:
            raise errors[0]
        return said

    def shutdown_all(self) -> None:
        self.shutdown(*self.handlers)


@pytest.fixture(params=[C10D, T5])
def backend(request, monkeypatch):
    b = Backend(
        request.param, request.node.originalname.removeprefix("test_")[:40].replace("_", "-"), monkeypatch, request
    )
    try:
        yield b
    finally:
        b.shutdown_all()


def _form(handlers, timeout_s: float = 60) -> list:
    """``next_rendezvous()`` of each handler at once; their RendezvousInfos, in the handlers' order."""
    results = [c.result(timeout_s=timeout_s) for c in [_Call(h.next_rendezvous) for h in handlers]]
    assert [e for _, e in results] == [None] * len(handlers), results
    return [info for info, _ in results]


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _agent(creds, run_id: str, **kw) -> EtcdRendezvousHandler:
    settings = dict(min_nodes=1, max_nodes=1, ttl_s=2, last_call_s=1, join_timeout_s=30, local_addr="127.0.0.1")
    return EtcdRendezvousHandler(run_id, EtcdClient(creds), **{**settings, **kw})


class _Call:
    """``fn()`` in a thread of its own; ``result()`` waits for what it returned or raised."""

    def __init__(self, fn):
        self.value, self.error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def result(self, timeout_s: float):
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"still running after {timeout_s} s"
        return self.value, self.error


def _closed(creds, run_id: str) -> bool:
    kv = EtcdClient(creds).get(creds.prefix + f"rdzv/{run_id}/round")
    return kv is not None and rounds.Round.loads(kv.value).closed


def _kill_all(cluster: LocalEtcd) -> None:
    for m in cluster.members:
        cluster.kill(m)


def _restart_all(cluster: LocalEtcd) -> None:
    for m in cluster.members:
        cluster.restart(m)
    cluster.wait_healthy()


# ---------------------------------------------------------------------------------------------- both backends
def test_handler_identity_and_agent_store(backend, monkeypatch):
    """``get_run_id`` is the run id torchrun gave, ``get_backend`` the registry's name, ``use_agent_store`` what
    the :data:`DIFFERS` row says (and False for both with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``)."""
    h = backend.make(1, 1)
    assert (h.get_run_id(), h.get_backend()) == (backend.run_id, backend.name)
    assert h.use_agent_store is False  # the fixture set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    assert h.use_agent_store is DIFFERS["use_agent_store"][backend.name]


def test_a_formed_round_gives_distinct_ranks_and_one_store(backend):
    """Three nodes (MIN 3, MAX 3) form a round: ranks 0..2, world 3 for each; the round's store is one store (a
    key set by rank 0 is read by the others) and every node is given the same workers' bootstrap address."""
    handlers = [backend.make(3, 3) for _ in range(3)]
    infos = _form(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2] and {i.world_size for i in infos} == {3}
    by_rank = sorted(infos, key=lambda i: i.rank)
    by_rank[0].store.set("contract/key", "from rank 0")
    assert [i.store.get("contract/key") for i in by_rank[1:]] == [b"from rank 0"] * 2
    addrs = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos}
    assert len(addrs) == 1 and next(iter(addrs))[1] > 0, addrs


def test_a_round_closes_once_min_nodes_joined_and_the_last_call_passed(backend):
    """torch's ``test_min_nodes_...``: MIN 2, MAX 3; two nodes join: the round forms with the two after the last
    call (3 s), not before, not waiting for a third."""
    handlers = [backend.make(2, 3, last_call_timeout=3) for _ in range(2)]
    start = time.monotonic()
    infos = _form(handlers)
    assert time.monotonic() - start >= 2.5, "the round formed before the last call"
    assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]


def test_a_round_closes_at_once_when_max_nodes_joined(backend):
    """torch's ``..._max_nodes_...``: MIN 1, MAX 2, a last call of 30 s; both nodes have their places well
    before it: MAX closes the round at once."""
    handlers = [backend.make(1, 2, last_call_timeout=30) for _ in range(2)]
    start = time.monotonic()
    infos = _form(handlers, timeout_s=40)
    assert time.monotonic() - start < 20, "the round waited for the last call"
    assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]


def test_a_node_whose_join_timed_out_is_not_in_the_next_round(backend):
    """A node joins the first round alone (MIN 2) and its join times out (RendezvousTimeoutError); it stays alive
    (torch's own tests drive handlers so). Two other nodes come: they form the round, the timed-out one is not in
    it. Before (t5-etcd): its joined key outlived the timeout, the round took it as rank 0, the other participant
    waited 30 s for an address it never published and failed with a raw ``DistStoreError``, the third stood by."""
    gave_up = backend.make(2, 2, join_timeout=3)
    with pytest.raises(RendezvousTimeoutError):
        gave_up.next_rendezvous()
    if backend.name == T5:  # its join is taken back at once (the round record shows it below too)
        creds = backend.creds
        joined, _ = EtcdClient(creds).get_prefix(creds.prefix + f"rdzv/{backend.run_id}/joined/")
        assert joined == [], f"the timed-out join is still there: {[kv.key for kv in joined]}"
    infos = _form([backend.make(2, 2) for _ in range(2)])
    assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]
    if backend.name == T5:
        r = rounds.Round.loads(EtcdClient(creds).get(creds.prefix + f"rdzv/{backend.run_id}/round").value)
        assert gave_up.me not in r.participants and r.formed


def test_two_late_nodes_are_two_nodes_waiting_and_leave_when_the_job_ends(backend):
    """Two nodes form a round (MIN 2, MAX 4); two more come late. torch counts them: the running nodes'
    ``num_nodes_waiting()`` says 2 (torch's wait list; t5-etcd before: 1 for any number of them). The job ends
    (``shutdown()``): the late nodes' ``next_rendezvous`` ends with RendezvousClosedError (both backends: a node
    on torch's wait list, not its redundancy list)."""
    first = [backend.make(2, 4) for _ in range(2)]
    _form(first)
    late = [backend.make(2, 4) for _ in range(2)]
    calls = [_Call(h.next_rendezvous) for h in late]
    seen: list[list[int]] = []

    def two_each() -> bool:
        seen.append([h.num_nodes_waiting() for h in first])  # as each joins: 1, then 2
        return seen[-1] == [2, 2]

    _until(two_each, 20, f"num_nodes_waiting() said {seen[-5:]}, not 2")
    assert max(max(s) for s in seen) == 2, seen
    assert all(c.value is None and c.error is None for c in calls), "a late node formed a round alone"
    assert backend.shutdown(*first) == [True, True]
    errors = [c.result(timeout_s=30)[1] for c in calls]
    assert all(type(e) is RendezvousClosedError for e in errors), errors


def test_a_late_node_waits_until_the_participants_leave_the_running_round(backend, monkeypatch):
    """Two nodes form a round (MIN 1, MAX 3) and keep training (they do not call ``next_rendezvous`` again, as an
    agent still stopping its workers, or stuck doing so); a third comes late. torch's contract: the running nodes
    are told (``num_nodes_waiting() > 0``), the late node waits, and the next round forms only once the
    participants have left the running one; then the three form it together (ranks 0..2, world 3). Before
    (t5-etcd): the late node's round closed without them once the last call and a 30 s grace had passed
    (shortened to 1 s here, so that the test fails in seconds without the rule): rank 0 of world 1 while the round
    before trained on, two worker groups of one job."""
    monkeypatch.setattr(rounds, "STOPPING_WORKERS_S", 1.0)
    first = [backend.make(1, 3, last_call_timeout=2) for _ in range(2)]
    before = _form(first)
    assert sorted(i.world_size for i in before) == [2, 2]
    late = backend.make(1, 3, last_call_timeout=2)
    arriving = _Call(late.next_rendezvous)
    _until(lambda: all(h.num_nodes_waiting() for h in first), 20, "the running nodes never heard of the late node")
    time.sleep(2 + rounds.STOPPING_WORKERS_S + 3)  # last call + t5-etcd's old grace, and room for a loaded machine
    assert arriving.value is None and arriving.error is None, "the late node did not wait for the participants"
    if backend.name == T5:
        r = rounds.Round.loads(
            EtcdClient(backend.creds).get(backend.creds.prefix + f"rdzv/{backend.run_id}/round").value
        )
        assert not r.formed and r.n == 1, f"a round formed beside the running one: {r}"
    again = [_Call(h.next_rendezvous) for h in first]  # the participants leave the round and join the next
    infos = [c.result(timeout_s=60) for c in again + [arriving]]
    assert [e for _, e in infos] == [None] * 3, infos
    assert sorted(i.rank for i, _ in infos) == [0, 1, 2] and {i.world_size for i, _ in infos} == {3}
    if DIFFERS["keeps_ranks"][backend.name]:  # their snapshots are where they left them; the late node comes last
        assert [i.rank for i, _ in infos[:2]] == [i.rank for i in before] and infos[2][0].rank == 2


def test_a_node_beyond_max_stands_by_uncounted_until_the_job_ends(backend):
    """torch's redundancy list: two nodes form a round (MIN 2, MAX 2); a third comes. It stands by (no error, no
    place, its join timeout does not apply: 3 s here) and the running nodes' ``num_nodes_waiting()`` stays 0
    (no room: no restart for it). When the job ends it leaves with the error of the :data:`DIFFERS` row."""
    first = [backend.make(2, 2) for _ in range(2)]
    _form(first)
    spare = backend.make(2, 2, join_timeout=3)
    standing_by = _Call(spare.next_rendezvous)
    deadline = time.monotonic() + 6  # twice its join timeout
    while time.monotonic() < deadline:
        assert [h.num_nodes_waiting() for h in first] == [0, 0], "a node beyond MAX was counted as waiting"
        time.sleep(0.2)
    assert standing_by.value is None and standing_by.error is None, standing_by.error
    assert backend.shutdown(*first) == [True, True]
    _, error = standing_by.result(timeout_s=30)
    assert type(error) is DIFFERS["spare_when_the_job_ends"][backend.name], repr(error)


def test_a_node_joining_again_after_its_workers_failed_restarts_the_others(backend):
    """torch's agent calls ``next_rendezvous()`` again when its workers fail: the other participants'
    ``num_nodes_waiting()`` turns > 0 (their monitor loop restarts their workers), they join too, and the same
    nodes form the next round (ranks 0..1, world 2)."""
    nodes = [backend.make(2, 2) for _ in range(2)]
    _form(nodes)
    assert nodes[1].num_nodes_waiting() == 0
    failed = _Call(nodes[0].next_rendezvous)
    _until(lambda: nodes[1].num_nodes_waiting() > 0, 20, "the other participant was not told")
    other = _Call(nodes[1].next_rendezvous)
    infos = [c.result(timeout_s=60) for c in (failed, other)]
    assert [e for _, e in infos] == [None, None], infos
    assert sorted((i.rank, i.world_size) for i, _ in infos) == [(0, 2), (1, 2)]


def test_a_closed_rendezvous_is_closed_for_every_node(backend):
    """``set_closed()``: ``is_closed()`` turns True on the node that closed it and on the others (a node built
    afterwards included), within seconds: torch's ``api.py`` gives the pair "semantics of eventual propagation"
    (c10d happens to say True at once on the closing node, t5-etcd once its watch has the change: not asserted);
    ``next_rendezvous()`` then raises RendezvousClosedError on a participant and on a node that never joined
    (torch's join op: a closed rendezvous admits nobody)."""
    nodes = [backend.make(2, 2) for _ in range(2)]
    _form(nodes)
    assert [h.is_closed() for h in nodes] == [False, False]
    nodes[0].set_closed()
    _until(nodes[0].is_closed, 10, "the node that closed the rendezvous does not see it closed")
    _until(nodes[1].is_closed, 10, "the other participant does not see the rendezvous closed")
    newcomer = backend.make(2, 2)
    _until(newcomer.is_closed, 10, "a node built after the close does not see it closed")
    for h in (nodes[1], newcomer):
        _, error = _Call(h.next_rendezvous).result(timeout_s=30)
        # a RendezvousClosedError, as torch's agent catches it; t5-etcd tells a participant of the newest round that
        # the job stopped without it (JobStoppedByAnotherNode, a subclass: the agent's exit 1, not a spare's 0)
        assert isinstance(error, RendezvousClosedError), repr(error)


def test_no_thread_of_a_handler_outlives_its_shutdown(backend):
    """Three nodes form a round and shut down (torch's tests expect a handler's threads gone after its
    ``shutdown()``; c10d's keep-alive timer is joined by it). When shutdown returns, none of the handlers' threads
    (by the :data:`DIFFERS` row's name) runs. Before (t5-etcd): each watch thread ran on until its idle stream's
    next progress notice or its 15 s idle bound."""
    prefix = DIFFERS["threads"][backend.name]
    before = set(threading.enumerate())
    handlers = [backend.make(3, 3) for _ in range(3)]
    _form(handlers)
    started = [t.name for t in set(threading.enumerate()) - before if t.name.startswith(prefix)]
    assert started, f"no thread named {prefix}*: the check below would prove nothing"
    backend.shutdown_all()
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith(prefix) and t.is_alive()]
    assert left == [], f"threads still running after shutdown(): {sorted(left)}"


# ---------------------------------------------------------------------------------------------- t5-etcd only: shutdown
def test_a_job_that_ends_while_every_member_is_down_closes_its_rendezvous_once_they_are_back(tmp_path):
    """The job ends (``shutdown()``) while no etcd member answers; they come back a few seconds later. The
    rendezvous ends up closed and shutdown says True, and the hot spare waiting beside the round leaves as one
    the job finished without. Before: the ``left/`` write failed first, its error skipped the close, shutdown
    said True anyway; once the members were back the rendezvous was open and the spare took the ended job's
    place (started its workers)."""
    with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
        creds = cluster.add_job_user("ended")
        node = _agent(creds, "ended")
        node.next_rendezvous()
        spare = _agent(creds, "ended", standby=True)
        waiting = _Call(spare.next_rendezvous)
        try:
            _kill_all(cluster)  # fault: every member down as the job ends
            ending = _Call(node.shutdown)
            time.sleep(3)  # the shutdown finds no member
            _restart_all(cluster)
            assert ending.result(timeout_s=90) == (True, None)
            assert _closed(creds, "ended"), "the job ended but its rendezvous is open"
            value, error = waiting.result(timeout_s=60)
            assert isinstance(error, RendezvousClosedError), f"the spare got {value!r} / {error!r}"
        finally:
            spare.shutdown()


def test_a_job_that_could_not_close_its_rendezvous_says_so(tmp_path, monkeypatch, capsys):
    """No etcd member answers for the whole of the close's retry (shortened here from 60 s): shutdown says
    False (torch's contract: the rendezvous was not closed) and one line says what is left to do. Before: True."""
    monkeypatch.setattr(handler_module, "CLOSE_WAIT_S", 2.0)
    with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
        node = _agent(cluster.add_job_user("unclosed"), "unclosed")
        node.next_rendezvous()
        _kill_all(cluster)
        assert node.shutdown() is False
    assert "could not close the rendezvous of unclosed" in capsys.readouterr().err


def test_a_participant_whose_rank_0_never_takes_its_place_gets_a_rendezvous_error(etcd, monkeypatch):
    """A round forms with a rank-0 node that never takes its place (here a member written by the test, its
    store a real TCPStore that nobody publishes the workers' address in). The other participant gives up after
    its store timeout (30 s; 5 s here, with a join timeout of 5 s: the same path without waiting out the 30) with
    a ``RendezvousError`` that says so, which torch's agent handles as a rendezvous failure. Before: the raw
    ``DistStoreError`` of torch's store."""
    import json

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from training.launch.rendezvous import round_store

    monkeypatch.setattr(round_store, "STORE_TIMEOUT_FLOOR_S", 5.0)
    creds = etcd.add_job_user("absent")
    node = _agent(creds, "absent", min_nodes=2, max_nodes=2, join_timeout_s=5)  # the oldest member: the closer
    absent_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client, prefix = EtcdClient(creds), creds.prefix + "rdzv/absent/"
    try:
        deadline = time.monotonic() + 20
        while client.get(prefix + "head") is None:  # the closer opens the first round
            assert time.monotonic() < deadline, "the first round was not opened"
            time.sleep(0.1)
        lease = client.grant(120)  # alive for the whole test, never taking its place
        client.put(
            prefix + "members/absent",
            json.dumps({"addr": "127.0.0.1", "node": 0, "store": f"127.0.0.1:{absent_store.port}"}),
            lease=lease,
        )
        client.put(prefix + "joined/0/absent", "", lease=lease)
        with pytest.raises(RendezvousError, match="its rank-0 node .* did not take its place within 5 s"):
            node.next_rendezvous()
        r = rounds.Round.loads(client.get(prefix + "round").value)
        assert r.participants == ["absent", node.me]  # the scenario: it was rank 0 of the formed round
    finally:
        node.shutdown()


# ---------------------------------------------------------------------------------------------- late nodes
def test_late_nodes_are_counted_as_far_as_the_round_has_room_and_not_in_the_first_round():
    """torch's handler puts late nodes beyond MAX on its redundancy list, not its wait list; the job's first
    round has no running node to tell (and counting each of N joins there would be N head writes)."""
    nxt = rounds.next_round(rounds.formed(rounds.Round(n=0), ["a", "b"]))
    assert rounds.arriving(nxt, {"a", "b", "c", "d"}, ["c", "d"], max_nodes=4) == 2
    assert rounds.arriving(nxt, {"a", "b", "c", "d"}, ["c", "d", "a"], max_nodes=3) == 1  # room for one
    assert rounds.arriving(nxt, {"b", "c", "d"}, ["c", "d"], max_nodes=3) == 2  # a lost: room for two
    assert rounds.arriving(rounds.Round(n=0), {"a", "b"}, ["a", "b"], max_nodes=4) == 0
    assert (
        rounds.closer_step(nxt, {"a", "b", "c"}, ["c"], min_nodes=2, max_nodes=4, now=0.0, last_call_s=1, settled=True)
        is rounds.Step.NOTE_ARRIVING
    )


# ---------------------------------------------------------------------------------------------- a spare at the end
_TORCHRUN_WITH = """
import sys
from torch.distributed.elastic.rendezvous import RendezvousHandler, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous import api
from torch.distributed.run import main

class Ended(RendezvousHandler):  # a hot spare's handler as the job ends: the rendezvous is closed
    def get_backend(self): return "ended"
    def next_rendezvous(self): raise getattr(api, sys.argv[1])("the job ended")
    def is_closed(self): return True
    def set_closed(self): pass
    def num_nodes_waiting(self): return 0
    def get_run_id(self): return "ended"
    def shutdown(self): return True

rendezvous_handler_registry.register("ended", lambda params: Ended())
sys.exit(main(["--rdzv-backend", "ended", "--rdzv-endpoint", "x:1", "--nnodes", "1", "--nproc-per-node", "1",
               "-m", "json.tool", "/dev/null"]))
"""


@pytest.mark.parametrize("error", ["RendezvousGracefulExitError", "RendezvousClosedError"])
def test_canary_no_rendezvous_error_ends_plain_torchrun_with_0(error):
    """Which error a spare's handler raises at the job's end: torch's agent (``SimpleElasticAgent.run``) catches
    ``RendezvousGracefulExitError`` as a graceful exit, but torch 2.13's ``launch_agent`` then reads the result
    it did not get (``'NoneType' object has no attribute 'is_failed'``): plain torchrun exits 1 either way, and
    with that error the project's agent would no longer see why. So t5-etcd raises ``RendezvousClosedError``,
    which the project's agent turns into exit 0. When this canary fails, torch exits 0 on the graceful error:
    raise that in ``next_rendezvous`` (and catch it in ``training.launch.agent``)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TORCHRUN_WITH, error], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    if error == "RendezvousGracefulExitError":
        assert "'NoneType' object has no attribute 'is_failed'" in done.stderr, done.stderr[-2000:]
    else:
        assert f"{error}: the job ended" in done.stderr, done.stderr[-2000:]


def test_a_node_taken_out_leaves_no_thread_behind(etcd, tmp_path, monkeypatch):
    """A straggler's node leaves the job at its next ``next_rendezvous()`` (its workers' take-out note): it stops
    its threads as shutdown does, and the job's rendezvous stays open for the others."""
    from training.job import agent_notes

    monkeypatch.setenv(agent_notes.HEARTBEAT_DIR_ENV, str(tmp_path))
    before = set(threading.enumerate())
    creds = etcd.add_job_user("taken")
    node = _agent(creds, "taken")
    node.next_rendezvous()
    assert agent_notes.request_take_out("slow")
    with pytest.raises(handler_module.NodeTakenOut):
        node.next_rendezvous()
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("t5f-rdzv")]
    assert left == [] and not _closed(creds, "taken"), left

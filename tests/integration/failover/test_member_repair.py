"""A member that lost its data rejoins by itself (training/launch/rendezvous/member_repair.py), on a real local
3-member etcd with TLS and auth on: the same start-time repair the EKS and ParallelCluster members run."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from training.launch.rendezvous.client import EtcdClient, b64
from training.launch.rendezvous.member_repair import MemberIdentity, has_data, plan_start
from training.launch.rendezvous.members import LocalEtcd


@pytest.fixture
def cluster(tmp_path):
    with LocalEtcd.start(str(tmp_path)) as etcd:
        yield etcd


def _members(etcd: LocalEtcd) -> dict[str, str]:
    """Member name ("" for an entry never started) -> ID, as the cluster lists them."""
    listed = EtcdClient(etcd.root_credentials()).post("cluster/member/list", {})["members"]
    return {m.get("name", ""): m["ID"] for m in listed}


def _read_from(etcd: LocalEtcd, member, key: str) -> str | None:
    """``key`` as ``member`` alone has it (a serializable read: its own copy, no round trip to the leader)."""
    client = EtcdClient(replace(etcd.root_credentials(), endpoints=(member.client_url,)))
    kvs = client.post("kv/range", {"key": b64(key), "serializable": True}).get("kvs", [])
    return kvs[0]["value"] if kvs else None


def _identity(m) -> MemberIdentity:
    return MemberIdentity(m.name, m.peer_url, m.data_dir)


def test_a_member_whose_data_is_gone_rejoins_with_every_key_and_a_rerun_changes_nothing(cluster):
    root = EtcdClient(cluster.root_credentials())
    root.put("/t5/before", "1")
    lost = cluster.members[1]
    old_id = _members(cluster)[lost.name]
    cluster.kill(lost)
    shutil.rmtree(lost.data_dir)
    root.put("/t5/while-gone", "2")  # two of three keep the quorum

    cluster.restart(lost)  # the member's own start: removed, added again, started "existing"
    cluster.wait_healthy(30)

    after = _members(cluster)
    assert sorted(after) == ["m0", "m1", "m2"] and after[lost.name] != old_id
    assert has_data(lost.data_dir)
    with open(f"{cluster.workdir}/etcd.log") as log:  # the member's one line says what its start did
        assert f"[etcd member m1] no data; removed its old entry ({old_id}), added {after['m1']}" in log.read()
    assert _read_from(cluster, lost, "/t5/before") == b64("1")
    assert _read_from(cluster, lost, "/t5/while-gone") == b64("2")
    # the repair run again on healthy members (a restart, a rerun): nothing to do, no membership change
    for m in cluster.members:
        assert plan_start(_identity(m), root, authenticated=True).state is None
    assert _members(cluster) == after


def test_a_repair_that_stopped_halfway_is_finished_by_the_next_start(cluster):
    """Crashed after the remove (no entry left): the next start adds it. Crashed after the add (an entry never
    started): the next start joins as that entry, not a second one."""
    root = EtcdClient(cluster.root_credentials())
    lost = cluster.members[2]
    cluster.kill(lost)
    shutil.rmtree(lost.data_dir)
    root.post("cluster/member/remove", {"ID": _members(cluster)[lost.name]})  # a start that died after the remove
    assert sorted(_members(cluster)) == ["m0", "m1"]

    half = plan_start(_identity(lost), root, authenticated=True)  # the next start: adds; then dies before etcd
    added = _members(cluster)[""]
    assert half.state == "existing" and f"m2={lost.peer_url}" in half.initial_cluster

    cluster.restart(lost)  # and the one after that joins as the entry added
    cluster.wait_healthy(30)
    now = _members(cluster)
    assert sorted(now) == ["m0", "m1", "m2"] and now["m2"] == added
    root.put("/t5/after", "3")
    assert _read_from(cluster, lost, "/t5/after") == b64("3")

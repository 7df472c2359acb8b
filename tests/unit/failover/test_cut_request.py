"""The agent's note that asks a blocked worker to cut its group (training/job/agent_notes.py) and the etcd ports a cut
keeps (training/job/failover.py). The cut itself: tests/integration/failover/test_group_sockets.py."""

from __future__ import annotations

from training.job.agent_notes import cut_request, request_cut
from training.job.failover import endpoint_ports


def test_the_agents_note_names_the_epoch_and_why_for_one_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("T5F_HEARTBEAT_DIR", str(tmp_path))
    assert cut_request(1234) is None
    assert request_cut(1234, 3, "a node was lost: epoch 4 is forming without it")
    assert cut_request(1234) == (3, "a node was lost: epoch 4 is forming without it")
    assert cut_request(1235) is None  # another worker's note is not this one's
    monkeypatch.setenv("T5F_HEARTBEAT_DIR", str(tmp_path / "missing"))
    assert not request_cut(1234, 3, "x") and cut_request(1234) is None  # no agent of this launcher: nobody to ask


def test_the_etcd_endpoints_ports_are_kept():
    assert endpoint_ports("https://127.0.0.1:2379, https://10.0.0.5:32543,") == frozenset({2379, 32543})
    assert endpoint_ports("") == frozenset()
    assert endpoint_ports("https://etcd.local") == frozenset()  # no port written: nothing to keep by number

"""chaos.local.log_digest: the lines a failed local scenario's message carries (CI keeps no files)."""

from chaos.local.log_digest import digest


def test_the_digest_merges_the_nodes_marked_lines_by_time_and_keeps_the_newest(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node0.log").write_text(
        "100.000 [rendezvous] round 0: rank 0 of 2 node(s)\n"
        "101.000 step      1/10 | loss 7.1\n"
        "104.500 in-place recovery: epoch 2 not agreed within 10 s: falling back to a full restart\n"
    )
    (logs / "node1.log").write_text("102.250 [agent] in-place: ranks 1 of epoch 1 were held by workers not running\n")
    lines = digest(tmp_path).splitlines()
    assert lines == [
        "node0 +0.0s [rendezvous] round 0: rank 0 of 2 node(s)",
        "node1 +2.2s [agent] in-place: ranks 1 of epoch 1 were held by workers not running",
        "node0 +4.5s in-place recovery: epoch 2 not agreed within 10 s: falling back to a full restart",
    ]
    assert digest(tmp_path, limit=1).splitlines() == lines[-1:]
    assert all(len(line) <= 20 for line in digest(tmp_path, width=20).splitlines())


def test_no_logs_no_digest(tmp_path):
    assert digest(tmp_path) == ""

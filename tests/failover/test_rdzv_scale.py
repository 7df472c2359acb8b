"""chaos.rdzv_scale: real c10d rendezvous handlers (threads) against a real store process, one node lost."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.rdzv_scale import ScaleResult, simulate, table
from training.launch.config import RdzvTuning

ROOT = Path(__file__).resolve().parents[2]


def test_lost_node_is_left_out_of_the_re_formed_round():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    delay, join = dr._delay, dr._RendezvousJoinOp.__call__
    # shorter last call and keep-alive than the launcher's (3 s, 1 s x 3) keep the test at a few seconds;
    # the protocol is the same
    r = simulate(4, tuning=RdzvTuning(last_call_timeout=1, keep_alive_max_attempt=2), steady_s=0.3,
                 timeout_s=60, probe=False, say=lambda _m: None)
    assert r.error == ""
    assert r.reformed_world == 3
    assert r.reformed_ranks == [0, 1, 2]  # distinct ranks 0..N-2
    assert not r.victim_in_new_round
    assert r.ok
    # the dead node is dropped only once its keep-alive expired (1 s x 2 after its last beat), and the round
    # closes after it, once the last call (1 s) for the 4th node ran out
    assert 1.0 <= r.reform_dropped_s <= 2.5
    assert r.reform_dropped_s + 0.9 <= r.reform_s <= r.reform_dropped_s + 3.0
    assert r.first_round_s < 5 and r.store_ops_per_s_first > 0
    assert r.agent_processes == 1 and r.cas_per_s_first > 0 and r.store_rt_per_s > 0
    # the agent's patches were applied for the run only (other tests in this process see torch's own functions)
    assert dr._delay is delay and dr._RendezvousJoinOp.__call__ is join


def test_agents_spread_over_processes_drop_the_lost_one():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    delay = dr._delay
    # 4 agents in 2 worker processes; the coordinator's "die" must reach the victim's process (else its
    # keep-alive goes on, it is never dropped and the re-formed round times out) and "fail" the other process's
    r = simulate(4, procs=2, tuning=RdzvTuning(last_call_timeout=1, keep_alive_max_attempt=2), steady_s=0.3,
                 timeout_s=20, probe=False, say=lambda _m: None)
    assert r.error == ""
    assert r.agent_processes == 2  # the handlers really ran in two processes
    assert r.reformed_world == 3 and r.reformed_ranks == [0, 1, 2]
    assert not r.victim_in_new_round
    assert 1.0 <= r.reform_dropped_s <= 2.5
    assert r.reform_dropped_s + 0.9 <= r.reform_s <= r.reform_dropped_s + 3.0
    assert r.ok and r.procs == 2
    # counts came back from the workers; this process patched nothing
    assert r.store_ops_per_s_first > 0 and r.cas_per_s_first > 0 and 0 <= r.cas_lost_pct_first <= 100
    assert dr._delay is delay


def test_table_marks_a_round_that_did_not_form():
    good = ScaleResult(nodes=4, poll_s=0.1, first_round_s=0.4, reform_dropped_s=2.0, reform_s=5.1, reformed_world=3,
                       reformed_ranks=[0, 1, 2], victim_in_new_round=False)
    bad = ScaleResult(nodes=9, poll_s=0.1, error="first round: 3/9 agents ranked after 120 s")
    out = table([good, bad])
    rows = out.splitlines()
    assert rows[2].startswith("| 4 | 1 | 0.10 | 0.40 | 2.00 | 5.10 |") and rows[2].endswith("| True |")
    assert rows[3].startswith("| 9 | 1 | 0.10 | - | - | - |") and rows[3].endswith("| False |")
    assert rows[-1] == "N=9: first round: 3/9 agents ranked after 120 s"


def test_cli_help_and_bad_node_count():
    h = subprocess.run([sys.executable, "-m", "chaos.rdzv_scale", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert h.returncode == 0 and "--nodes" in h.stdout and "What it cannot show" in h.stdout
    r = subprocess.run([sys.executable, "-m", "chaos.rdzv_scale", "--nodes", "8,1"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "each count must be >= 2" in r.stderr
    r = subprocess.run([sys.executable, "-m", "chaos.rdzv_scale", "--nodes", "8,4", "--procs", "5"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--procs 5" in r.stderr and "smallest --nodes (4)" in r.stderr


@pytest.mark.e2e
def test_thirty_two_agents_re_form():
    r = simulate(32, timeout_s=120, say=lambda _m: None)
    assert r.ok, r

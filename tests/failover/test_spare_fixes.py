"""torch 2.13's rendezvous with a hot spare, on real c10d handlers (tests/failover/spare_probe.py): after the
participants re-form, the agent left over must stand by on the redundancy list, not sit on the wait list
(where the running agents would see a node waiting and restart the job again and again)."""
from pathlib import Path

from tests.failover.rdzv_probe import run_probe

PROBE = Path(__file__).with_name("spare_probe.py")


def probe(*args: str) -> dict:
    return run_probe(PROBE, *args)


def test_with_the_fix_the_left_over_agent_stands_by_and_nobody_is_waiting():
    r = probe("fixed")
    assert len(r["first"]) == 2 and len(r["second"]) == 2, r
    assert r["waiting"] == [0, 0] and r["wait_list"] == 0 and r["redundancy_list"] == 1, r
    # not even for a moment right after the round formed (the left-over agent sits on the wait list for up to
    # torch's 1 s poll before it moves: without the num_nodes_waiting patch, 2 runs in 4 saw 1 here)
    assert r["max_waiting_seen"] == 0, r


def test_without_it_torch_leaves_the_agent_waiting_so_the_job_would_restart_forever():
    """The reason for the fix: if this starts failing, torch fixed it upstream and the patch can go."""
    r = probe()
    assert len(r["second"]) == 2 and r["wait_list"] == 1 and all(w == 1 for w in r["waiting"]), r

"""One chaos idiom on every platform: each harness keeps a table of ``chaos.scenario.Scenario`` entries (how to
inject the fault, what the verdict expects, the scenario's own checks), exactly one per name ``chaos.catalog``
lists for that platform, so a new scenario is its catalog line plus one entry per platform (and its fault)."""

from __future__ import annotations


def test_the_c10d_comparison_mode_refuses_what_needs_etcd_before_anything_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    run = [sys.executable, "-m", "chaos.local", "--coordinator", "store", "--dry-run"]
    r = subprocess.run(
        run + ["--scenarios", "worker-kill,node-kill-with-spare,store-outage"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --coordinator store cannot run node-kill-with-spare, store-outage (hot spares and the etcd members' "
        "faults need etcd): drop --coordinator store, or pick other --scenarios"
    )
    r = subprocess.run(run + ["--scenarios", "worker-kill"], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--rdzv-backend=c10d" in r.stdout

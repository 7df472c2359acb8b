"""Meta-device init: each rank materialises only its shards, and the weights equal a CPU build's, bitwise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TORCHRUN

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_meta_init import SMALL


@pytest.mark.parametrize("nproc", [1, 3])
def test_each_rank_materialises_its_shards_and_the_gathered_model_equals_the_cpu_build(nproc, tmp_path):
    r = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            f"--nproc_per_node={nproc}",
            "tests/support/meta_init_probe.py",
            json.dumps(SMALL),
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank-*.json"))]
    assert sorted(x["rank"] for x in ranks) == list(range(nproc))
    for x in ranks:
        assert x["recorded"] and x["was_meta"] and x["tied"] and x["params"] > 20
        assert x["differ"] == [], x
    # Together the ranks hold the model once (tied embeddings counted once), each about 1/nproc of it.
    assert sum(x["local_numel"] for x in ranks) == ranks[0]["total_numel"]
    assert max(x["local_numel"] for x in ranks) <= ranks[0]["total_numel"] / nproc * 1.05


def test_the_build_benchmark_prints_both_ways_with_their_figures():
    r = subprocess.run(
        [sys.executable, "-m", "training.bench_init", "--preset", "debug", "--nproc", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert [(row[0], row[1], row[2]) for row in rows] == [("debug", "2", "cpu"), ("debug", "2", "meta")]
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)

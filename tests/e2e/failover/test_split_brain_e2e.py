"""End to end: the split-brain scenario of the local harness on real torchrun agents, real etcd and the real
commit fence. The training nodes' agents are SIGSTOPped (their workers train on) until the hot spares form a new
round; the old group is stopped by the fence at its next commit with one line, no checkpoint of it completes after
the new group's restore, and the final weights equal the uninterrupted run's bitwise. (That the verdict fails on
a real run without the fault: test_chaos_e2e's test over every local scenario; without the fence:
tests/unit/failover/test_split_brain_verdict.py.)"""

from dataclasses import replace
from pathlib import Path

import pytest

from chaos.local.config import REPO, LocalChaosConfig
from chaos.local.log_digest import digest
from chaos.local.scenarios import reference, run_scenario, scenarios
from chaos.local.split_brain import STALE_GROUP_FENCED

pytestmark = pytest.mark.e2e

# the lean job of test_chaos_e2e (same reference, cached under .chaos/cache)
CFG = LocalChaosConfig(
    steps=10, interval=3, slow_commit_s=5.0, extra_args=("--model.dropout", "0"), scenario_timeout_s=240
)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(CFG, REPO / ".chaos" / "cache", tmp_path_factory.mktemp("chaos-ref"))


def test_the_fence_stops_the_old_group_and_only_the_new_groups_checkpoints_count(ref, tmp_path):
    sc = replace(scenarios(CFG)["split-brain"])
    res = run_scenario(CFG, sc, ref, tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in res.checks if not c.ok]
    assert res.passed, f"split-brain failed ({res.workdir}/logs): {failed}\n{digest(res.workdir)}"
    fenced = next(c for c in res.checks if c.name == STALE_GROUP_FENCED)
    assert "was replaced by round" in fenced.detail
    assert "weights bitwise == reference" in {c.name for c in res.checks}
    codes = res.figures["exit codes"]
    assert sorted(codes.values()) == [0, 0, 9, 9], (
        codes
    )  # the spares finished; the old group's agents: the fence's code
    assert res.world_sizes == [CFG.world]
    assert Path(res.workdir, "logs").is_dir()

"""End to end: the local chaos harness's corrupt-snapshot scenario on the lean job of test_chaos_e2e (its config,
so the two share one cached reference run): a worker frozen with its newest snapshot replicated, 64 bytes of its
own-node copy inverted, SIGKILLed (the peer's replica must be restored, bitwise equal to the reference), then
every generation of its shard damaged, own and replica (storage must be restored, each damaged copy named).
test_verdicts.py shows the same checks fail without the fault's effects."""

import pytest

from chaos.local.config import REPO
from chaos.local.log_digest import digest
from chaos.local.scenarios import reference, run_scenario, scenarios
from tests.e2e.failover.test_chaos_e2e import CFG

pytestmark = pytest.mark.e2e


def test_corrupt_snapshot_restores_the_replica_then_storage_bitwise(tmp_path_factory, tmp_path):
    ref = reference(CFG, REPO / ".chaos" / "cache", tmp_path_factory.mktemp("chaos-ref"))
    res = run_scenario(CFG, scenarios(CFG)["corrupt-snapshot"], ref, tmp_path)
    checks = {c.name: c for c in res.checks}
    failed = [f"{c.name}: {c.detail}" for c in res.checks if not c.ok]
    assert res.passed, f"({res.workdir}/logs): {failed}\n{digest(res.workdir)}"
    assert "restored from peer step" in checks["damaged own snapshot skipped for the peer replica"].detail
    assert "restored from storage step" in checks["damaged own snapshot and replica: storage restored, named"].detail
    assert checks["weights bitwise == reference"].ok

"""The contract emulator runs the shipped runtime: a training pod that exits 9 (its worker group stopped by the commit
fence, the job going on in a newer round) is replaced by the Job controller without using its index's retry, and
the TrainJob completes without a JobSet restart."""

from __future__ import annotations

from tests.integration.k8s.test_emulator import pods, rendered, run, runtime, with_command  # noqa: F401 - fixture

# Index 1's first pod is a fenced group's (exit 9); its replacement, a node that rejoined the rendezvous and was
# not needed, exits 0. Index 0 trains on and exits 0 once index 1's replacement has run.
FENCED_ONCE = """import os, sys, time
d, rank = sys.argv[1], os.environ["PET_NODE_RANK"]
os.makedirs(d, exist_ok=True)
if rank == "1":
    marker = os.path.join(d, "fenced")
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(9)
    open(os.path.join(d, "rejoined"), "w").close()
    sys.exit(0)
for _ in range(600):
    if os.path.exists(os.path.join(d, "rejoined")):
        sys.exit(0)
    time.sleep(0.1)
sys.exit(1)
"""


def test_a_fenced_pod_is_replaced_without_using_a_retry(rendered, tmp_path):  # noqa: F811 - the fixture
    _, tj = rendered
    # no retry per index and no gang restart: any counted failure would fail the TrainJob
    emu = run(runtime(max_restarts=0, retries_per_index=0), with_command(tj, FENCED_ONCE, "/fsx/m"), tmp_path)
    assert emu.state == "Complete", emu.message
    assert emu.restarts == 0 and pods(emu) == {"node/0": 1, "node/1": 2}
    first, repl = [p for p in emu.pod_log if p.job == "node" and p.rank == 1]
    assert first.exit_code == 9 and repl.why == "replaced (Ignore)" and repl.exit_code == 0
    assert repl.env["HOSTNAME"] == "t5-emu-unit-node-0-1"  # same index, same hostname: it rejoins as that node
    (failed,) = [e.detail for e in emu.events if e.what == "pod failed"]
    assert "exit 9" in failed and "podFailurePolicy Ignore" in failed

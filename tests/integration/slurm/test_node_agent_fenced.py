"""The per-node wrapper of the Slurm batch script, run as srun runs it: an agent whose worker group the commit fence
stopped (exit 9: a newer round, the spares, trains the job) leaves the step with exit 0 and one line, so that srun
--kill-on-bad-exit does not kill the newer group and requeue the job; any other failure still passes through."""

from __future__ import annotations

import subprocess

from chaos.slurm_split_brain import FENCED_NODE_LINE
from cluster_assets.slurm.render import render
from tests.unit.slurm.test_render import BASE


def test_a_fenced_agent_leaves_the_step_without_failing_it(tmp_path):
    text = render(BASE)
    start = text.index("NODE_AGENT='")
    assign = text[start : text.index('exit "$rc"\'', start) + len('exit "$rc"\'')]
    script = tmp_path / "agent.sh"
    script.write_text(assign + '\nexec bash -c "$NODE_AGENT" t5-node-agent "$@"\n')
    fenced = subprocess.run(["bash", str(script), "bash", "-c", "exit 9"], capture_output=True, text=True, timeout=30)
    assert fenced.returncode == 0, fenced.stderr
    (line,) = [x for x in fenced.stderr.splitlines() if FENCED_NODE_LINE in x]
    assert line.startswith("[t5-node-agent ") and "the job goes on in that round; this node leaves the step" in line
    crashed = subprocess.run(["bash", str(script), "bash", "-c", "exit 1"], capture_output=True, text=True, timeout=30)
    assert crashed.returncode == 1 and FENCED_NODE_LINE not in crashed.stderr

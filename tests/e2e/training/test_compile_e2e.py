"""The GPU-path options end to end on CPUs: 'sdpa_bias' attention with every T5 block compiled, through meta-device
init, FSDP2, a SIGKILL and a resume."""

from __future__ import annotations

import json

import pytest

from tests.conftest import STEP_3_COMMITTED, TINY_STEPS, tiny_run
from training.checkpoint import latest_complete, step_dir
from training.compare import compare

pytestmark = pytest.mark.e2e
FAST_PATH = ("--model.attention", "sdpa_bias", "--parallel.compile", "on")


def starts(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "start"]


def test_compiled_sdpa_bias_run_killed_and_resumed_equals_its_uninterrupted_run(tmp_path):
    reference = tiny_run(tmp_path / "reference", 2, *FAST_PATH)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    killed = tmp_path / "killed"
    r = tiny_run(killed, 2, *FAST_PATH, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "SIGKILL" in r.stdout + r.stderr
    assert latest_complete(killed / "checkpoints").name == "step_00000003"
    r = tiny_run(killed, 2, *FAST_PATH)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from step 3" in r.stdout
    # every run after the reference found the compiled kernels of the same key on this node (training.model.
    # compile_cache), and the reference published the portable artefacts for nodes that never compiled
    caches = [s["compile_cache"] for s in starts(tmp_path / "reference") + starts(killed)]
    key = caches[0]["key"]
    assert [c["key"] for c in caches] == [key] * 3 and [c["local_hit"] for c in caches[1:]] == [True, True], caches
    assert (tmp_path / "reference" / "compile-cache" / f"{key}.bin").stat().st_size > 0
    assert (
        compare(
            step_dir(tmp_path / "reference" / "checkpoints", TINY_STEPS), step_dir(killed / "checkpoints", TINY_STEPS)
        )
        == []
    )

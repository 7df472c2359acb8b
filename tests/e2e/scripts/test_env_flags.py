"""DRY_RUN means the same everywhere: one parser (tools/env_flags.py), and every entry point that reads it.

Each entry point runs (the script its `make` target runs, to see its own exit status) with every spelling. A dry run
must print what it would do and exit 0; a real run must get past the decision and stop at once for lack of a cluster
(no kubeconfig, no sbatch on PATH, no AWS credentials), which nothing here has; a bad value must stop with exit 2
naming the variable.
"""

from __future__ import annotations

import pytest

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.integration.scripts.test_env_flags import ENTRY_POINTS, FALSE_SPELLINGS, out, run_make


@pytest.mark.e2e
@pytest.mark.parametrize("value", FALSE_SPELLINGS)
def test_local_train_runs_for_every_false_spelling(value: str | None, isolated: dict[str, str]) -> None:
    ep = ENTRY_POINTS["train-local"]
    p = run_make(ep, isolated, value)
    assert ep.real(p) and not ep.dry(p), f"DRY_RUN={value!r}: rc={p.returncode}\n{out(p)[-1500:]}"

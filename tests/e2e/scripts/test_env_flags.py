"""DRY_RUN means the same everywhere: one parser (tools/env_flags.py), and every entry point that reads it.

Each entry point runs (the script its `make` target runs, to see its own exit status) with every spelling. A dry run
must print what it would do and exit 0; a real run must get past the decision and stop at once for lack of a cluster
(no kubeconfig, no sbatch on PATH, no AWS credentials), which nothing here has; a bad value must stop with exit 2
naming the variable.
"""
from __future__ import annotations

import os

import pytest


# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.integration.scripts.test_env_flags import (ENTRY_POINTS, FALSE_SPELLINGS, out,
                                                      run_make)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment with no cluster and no credentials: PATH without Slurm's commands, no kubeconfig, no AWS
    credentials or instance metadata, a scratch shared directory, no local Slurm lab."""
    tmp = tmp_path_factory.mktemp("env-flags")
    bindir = tmp / "bin"
    bindir.mkdir()
    slurm = {"sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "salloc", "sacct"}
    for d in os.environ["PATH"].split(os.pathsep):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name not in slurm and not (bindir / name).exists():
                    (bindir / name).symlink_to(os.path.join(d, name))
    (tmp / "not-a-dir").write_text("")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "SLURM_", "KUBE")) and k not in ("DRY_RUN", "NODES", "NPROC", "PRESET")}
    env.update(PATH=str(bindir), KUBECONFIG=str(tmp / "no-kubeconfig"), SHARED_DIR=str(tmp / "shared"),
               SLAB_ROOT=str(tmp / "no-lab"), AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-credentials"),
               AWS_CONFIG_FILE=str(tmp / "no-config"), AWS_EC2_METADATA_DISABLED="true",
               OUT_FILE=str(tmp / "not-a-dir"))
    (tmp / "shared").mkdir()
    return env



@pytest.mark.e2e
@pytest.mark.parametrize("value", FALSE_SPELLINGS)
def test_local_train_runs_for_every_false_spelling(value: str | None, isolated: dict[str, str]) -> None:
    ep = ENTRY_POINTS["train-local"]
    p = run_make(ep, isolated, value)
    assert ep.real(p) and not ep.dry(p), f"DRY_RUN={value!r}: rc={p.returncode}\n{out(p)[-1500:]}"

"""The submit's etcd rule (tools/slurm/membership.py) on given settings: a job with no etcd is refused with the fix,
unless the submitter opted out; REQUIRE_ETCD becomes the flag the job settings read."""

from __future__ import annotations

import pytest

from cluster_assets.slurm.config import SlurmJobConfig
from cluster_facts.names import ETCD_ENV_FILE
from tools.env_flags import EnvFlagError
from tools.slurm import submit
from tools.slurm.membership import missing_etcd

ENDPOINTS = {"T5_ETCD_ENDPOINTS": "https://10.0.1.10:2379"}


def test_a_job_without_etcd_is_refused_naming_the_fix_and_the_opt_out():
    why = missing_etcd(etcd_env=None, require_etcd=True, env={}, stack_file_here=False)
    assert why is not None and "\n" not in why
    assert "neither --etcd-env nor T5_ETCD_ENDPOINTS is set" in why
    assert "losing that node would requeue the whole job" in why
    assert f"--etcd-env FILE (a file of T5_ETCD_* lines; on the ParallelCluster head node {ETCD_ENV_FILE})" in why
    assert why.endswith("or set REQUIRE_ETCD=0 (--no-require-etcd) to submit it that way")
    # on the head node, where the stack wrote the members' settings: that file is the fix
    here = missing_etcd(etcd_env=None, require_etcd=True, env={"T5_ETCD_CA": "/x"}, stack_file_here=True)
    assert f"pass --etcd-env {ETCD_ENV_FILE} (the stack's etcd members" in here


@pytest.mark.parametrize(
    "etcd_env, require, env",
    [
        ("/fsx/etcd.env", True, {}),  # a file of T5_ETCD_* lines
        (None, True, ENDPOINTS),  # the submit environment's, which sbatch passes on
        (None, False, {}),  # opted out: the c10d store on purpose
    ],
)
def test_etcd_given_or_an_explicit_opt_out_submits(etcd_env, require, env):
    assert missing_etcd(etcd_env=etcd_env, require_etcd=require, env=env, stack_file_here=True) is None


def test_require_etcd_defaults_on_and_reads_from_the_environment():
    assert SlurmJobConfig().require_etcd is True
    assert "--no-require-etcd" in submit.env_args({"REQUIRE_ETCD": "0"})
    assert "--no-require-etcd" in submit.env_args({"REQUIRE_ETCD": "off"})
    assert "--require-etcd" in submit.env_args({"REQUIRE_ETCD": "yes"})
    assert not any("etcd" in a for a in submit.env_args({"REQUIRE_ETCD": ""}))  # empty = unset: the default
    with pytest.raises(EnvFlagError, match=r"REQUIRE_ETCD='maybe' is neither true nor false"):
        submit.env_args({"REQUIRE_ETCD": "maybe"})
    a = submit.build_parser().parse_args(["--no-require-etcd"])
    assert a.require_etcd is False

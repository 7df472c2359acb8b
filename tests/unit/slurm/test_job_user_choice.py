"""Which submits make the job's etcd user through the head node's helper (tools.slurm.job_user): only those whose
settings name the helper and no job user; and the job ids they pass it."""

from __future__ import annotations

import re
from pathlib import Path

from tools.slurm.job_user import JOB_KEY, helper_for, job_key

HELPER = "/usr/local/sbin/t5-etcd-add-job"


def test_the_stacks_settings_name_the_helper_a_jobs_own_do_not(tmp_path: Path) -> None:
    stack = tmp_path / "etcd.env"
    stack.write_text(f"# the head node's\nT5_ETCD_ENDPOINTS=https://10.0.1.10:2379\nT5_ETCD_ADD_JOB={HELPER}\n")
    job = tmp_path / "job.env"
    job.write_text("T5_ETCD_ENDPOINTS=https://10.0.1.10:2379\nT5_ETCD_USER=job-x\nT5_ETCD_ADD_JOB=/x\n")
    assert helper_for(str(stack), {}) == HELPER  # --etcd-env /etc/t5-failover/etcd.env
    assert helper_for(None, {"T5_ETCD_ADD_JOB": HELPER}) == HELPER  # a login shell's exported settings
    assert helper_for(str(job), {"T5_ETCD_ADD_JOB": HELPER}) is None  # a job's job.env is used as given
    assert helper_for(None, {"T5_ETCD_ROOT_PASSWORD_FILE": "/x"}) is None  # root's credentials (the local lab)
    assert helper_for(None, {}) is None


def test_job_ids_are_the_runs_name_and_fresh_random_digits() -> None:
    keys = {job_key("T5_base.Run 1") for _ in range(20)}
    assert len(keys) == 20  # a resubmitted run never meets its earlier job's user
    for key in keys:
        assert re.fullmatch(r"t5-base\.run-1-[0-9a-f]{8}", key) and JOB_KEY.fullmatch(key)
    assert JOB_KEY.fullmatch(job_key("x" * 200)) and JOB_KEY.fullmatch(job_key("___"))

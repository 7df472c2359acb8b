"""On the ParallelCluster head node the submit makes the job's own etcd user through the root helper its etcd.env
names (T5_ETCD_ADD_JOB) and renders the batch script with that job's job.env, so no job holds root's password;
a helper that fails stops the submit before sbatch. sbatch is a recorder and the helper a stand-in that writes a
job.env (the real helper against a real 3-member etcd: tests/e2e/infra/test_infra_pcluster.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.integration.slurm.test_submit_requires_etcd import submit

STAND_IN = """#!/bin/sh
# t5-etcd-add-job JOB, as the head node's helper answers: the job.env path last
echo "$*" >> {calls}
[ -n "{fail}" ] && {{ echo "t5-etcd-add-job: no etcd member at https://10.0.1.10:2379 answered" >&2; exit 3; }}
mkdir -p {jobs}/$1
printf 'T5_ETCD_ENDPOINTS=https://10.0.1.10:2379\\nT5_ETCD_USER=job-%s\\n' "$1" > {jobs}/$1/job.env
echo "etcd user job-$1: read/write /t5-failover/jobs/$1/; credentials in {jobs}/$1/job.env" >&2
echo {jobs}/$1/job.env
"""


def _stack_settings(tmp_path: Path, fail: bool = False) -> Path:
    helper, calls = tmp_path / "t5-etcd-add-job", tmp_path / "helper-calls"
    helper.write_text(STAND_IN.format(calls=calls, fail="1" if fail else "", jobs=tmp_path / "jobs"))
    helper.chmod(0o755)
    stack = tmp_path / "etcd.env"  # what etcd_client.sh writes: no root password, the helper
    stack.write_text(f"T5_ETCD_ENDPOINTS=https://10.0.1.10:2379\nT5_ETCD_ADD_JOB={helper}\n")
    return stack


def test_the_submit_renders_the_job_with_its_own_user(tmp_path: Path) -> None:
    stack = _stack_settings(tmp_path)
    proc, calls = submit(tmp_path, "--etcd-env", str(stack))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = (tmp_path / "helper-calls").read_text().split()
    assert re.fullmatch(r"r-[0-9a-f]{8}", job)  # the run's name and fresh digits
    script = (tmp_path / "runs" / "r" / "job.sbatch").read_text()
    (etcd_env,) = re.findall(r"^ETCD_ENV=(.*?)\s+#", script, flags=re.M)
    assert shlex.split(etcd_env) == [str(tmp_path / "jobs" / job / "job.env")]  # the job's, not the stack's
    assert f"[train-slurm] this job's etcd user: {tmp_path}/jobs/{job}/job.env" in proc.stdout
    assert len(calls.read_text().splitlines()) == 1
    # the same from a login shell's exported settings (no --etcd-env)
    proc, calls = submit(
        tmp_path, T5_ETCD_ENDPOINTS="https://10.0.1.10:2379", T5_ETCD_ADD_JOB=str(tmp_path / "t5-etcd-add-job")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len((tmp_path / "helper-calls").read_text().split()) == 2


def test_a_helper_that_fails_stops_the_submit_before_sbatch(tmp_path: Path) -> None:
    stack = _stack_settings(tmp_path, fail=True)
    proc, calls = submit(tmp_path, "--etcd-env", str(stack))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "could not make this job's etcd user" in line and "no etcd member at https://10.0.1.10:2379" in line
    assert not calls.exists() and not (tmp_path / "runs" / "r" / "job.sbatch").exists()

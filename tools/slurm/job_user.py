"""A Slurm job's own etcd user, made at submit by the ParallelCluster head node's root helper.

On ParallelCluster root's etcd password is root's only (the head node's ``/etc/t5-failover/admin``): the stack's
``/etc/t5-failover/etcd.env`` names a helper instead (``T5_ETCD_ADD_JOB``, run through sudo: any user, that
command only), which makes the job's user and writes its credentials into the submitter's
``~/.t5-failover/jobs/<job>/job.env`` (cluster_assets/parallelcluster/node_setup/etcd_client.sh). The submit calls
it and renders the batch script with that job.env, so the job's nodes only ever hold the job's credentials.
Elsewhere (the local lab, a site that gives root's credentials or a job's job.env) nothing changes.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from typing import Mapping

#: The variable of the stack's etcd.env that names the helper.
ADD_JOB_VAR = "T5_ETCD_ADD_JOB"
#: What the helper accepts as a job id (etcd_client.sh checks the same).
JOB_KEY = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


class JobUserError(RuntimeError):
    """The helper did not make the job's user (its exit status and last line in the message)."""


def read_settings(path: str) -> dict[str, str]:
    """The ``T5_ETCD_*`` lines of an env file (``NAME=value``, optionally ``export``), as the batch script reads."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.fullmatch(r"(?:export )?(T5_ETCD_[A-Z_]+)=[\"']?([^\"']*)[\"']?", line.strip())
            if m:
                out[m.group(1)] = m.group(2)
    return out


def helper_for(etcd_env: str | None, env: Mapping[str, str]) -> str | None:
    """The helper that makes this job's user, or None when the job has its settings already: a rendered
    ``etcd_env`` file (or else the submit environment) that names the helper and no job user."""
    settings = read_settings(etcd_env) if etcd_env else env
    if settings.get("T5_ETCD_USER"):
        return None  # a job's own job.env: used as given
    return settings.get(ADD_JOB_VAR) or None


def job_key(run_name: str) -> str:
    """A new job id for the helper: the run's name (lowercased, other characters as ``-``) and 8 random hex
    digits, so a resubmitted run never meets the user of its earlier job."""
    stem = re.sub(r"[^a-z0-9.-]+", "-", run_name.lower()).strip(".-")[:54] or "job"
    return f"{stem}-{secrets.token_hex(4)}"


def make_job_user(helper: str, key: str, timeout_s: float = 120) -> str:
    """Run the helper (through ``sudo -n`` unless this is root) for job id ``key``; returns its job.env path."""
    if not JOB_KEY.fullmatch(key):
        raise ValueError(f"job id {key!r} must be 1-63 lowercase letters, digits, '.' or '-'")
    cmd = [helper, key] if os.geteuid() == 0 else ["sudo", "-n", helper, key]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JobUserError(f"could not run {' '.join(cmd)}: {e}") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not os.path.isabs(lines[-1]):
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise JobUserError(
            f"could not make this job's etcd user ({' '.join(cmd)}: exit {proc.returncode}): {why}; check the etcd "
            f"members (journalctl -u t5-etcd on them) and that {helper} is allowed by /etc/sudoers.d/t5-etcd-add-job"
        )
    return lines[-1]

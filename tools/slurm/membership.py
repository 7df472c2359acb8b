"""Whether a Slurm job keeps its membership in etcd, decided before it is submitted.

A job given no ``T5_ETCD_*`` settings still runs: the batch script falls back to a c10d store on the job's first
node and says so only in the job log, where nobody reads it until that node is lost and the whole job requeues
(failover silently off). So the submit refuses such a job, where the submitter reads it, unless the submitter asked
for it (``REQUIRE_ETCD=0`` / ``--no-require-etcd``: a cluster without etcd).
"""

from __future__ import annotations

from typing import Mapping

from cluster_facts.names import ETCD_ENV_FILE

#: The variable that lets a job run without etcd (false: submit it anyway); the flag is ``--no-require-etcd``.
OPT_OUT_VAR = "REQUIRE_ETCD"


def missing_etcd(
    *, etcd_env: str | None, require_etcd: bool, env: Mapping[str, str], stack_file_here: bool
) -> str | None:
    """Why a job may not be submitted without etcd, in one line naming the fix; None when it has etcd (an
    ``etcd_env`` file, or ``T5_ETCD_ENDPOINTS`` in the environment ``sbatch`` passes on) or the submitter opted out.
    ``stack_file_here``: :data:`ETCD_ENV_FILE` exists on this host (the ParallelCluster head node)."""
    if etcd_env or env.get("T5_ETCD_ENDPOINTS") or not require_etcd:
        return None
    fix = (
        f"pass --etcd-env {ETCD_ENV_FILE} (the stack's etcd members; a login shell exports it: `bash -l`)"
        if stack_file_here
        else "pass --etcd-env FILE (a file of T5_ETCD_* lines; on the ParallelCluster head node "
        f"{ETCD_ENV_FILE}) or export the T5_ETCD_* settings"
    )
    return (
        "this job has no etcd membership store (neither --etcd-env nor T5_ETCD_ENDPOINTS is set): its first node "
        "would host the rendezvous store and losing that node would requeue the whole job; "
        f"{fix}, or set {OPT_OUT_VAR}=0 (--no-require-etcd) to submit it that way"
    )

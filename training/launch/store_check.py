"""Before an agent joins a standalone store's rendezvous: is the store up, and does it serve this job?

A store started with ``python -m training.rdzv_store --job-id ID`` publishes ``ID`` under
:data:`training.rdzv_store.JOB_ID_KEY` (a shared store publishes ""). Every agent (:mod:`training.launch.agent`)
with ``is_host=false`` calls :func:`check_store` first, so an agent pointed at another job's store exits 2
with one line naming both ids instead of joining (and disturbing) that job's rendezvous.

Matching rule (:func:`serves`): a store pinned to job ``ID`` serves the rendezvous ids ``ID`` itself, and the
ids the platform mappings derive from a job name: ``trainjob-ID`` (Kubeflow TrainJob ``ID``) and ``slurm-ID``
or ``slurm-ID-rN`` (Slurm job ``ID``, any requeue; a store pinned to ``slurm-ID`` also serves ``slurm-ID-rN``).
So ``--job-id <jobset name>`` and ``--job-id trainjob-<jobset name>`` both work on EKS. A shared store (no
``--job-id``) serves every id.

This is a guard against a mis-pointed endpoint, not authentication: any client that reaches the port can read
or overwrite the key (docs/failover.md, "Store security").
"""

from __future__ import annotations

import datetime
import re

from training.launch.config import LaunchError

#: How long an agent waits for the job id key once connected: the store writes it right after it starts
#: listening, so only a store that is not ``training.rdzv_store`` (which never writes it) makes this wait.
KEY_WAIT_S = 2.0
_PLATFORM_ID = re.compile(r"^(?:trainjob|slurm)-(?P<job>.+)$")
_REQUEUE = re.compile(r"^(?P<job>.+)-r\d+$")


def serves(store_job_id: str, rdzv_id: str) -> bool:
    """True when a store pinned to ``store_job_id`` ("" = shared) serves the rendezvous id ``rdzv_id``."""
    if not store_job_id or store_job_id == rdzv_id:
        return True
    m = _PLATFORM_ID.match(rdzv_id)
    if not m:
        return False
    job = m.group("job")
    ids = {job}
    requeue = _REQUEUE.match(job) if rdzv_id.startswith("slurm-") else None
    if requeue:  # the same Slurm job after a requeue: slurm-ID-rN
        ids |= {requeue.group("job"), f"slurm-{requeue.group('job')}"}
    return store_job_id in ids


def store_job_id(endpoint: str, connect_timeout_s: float) -> str | None:
    """The job id the store at HOST:PORT publishes ("" = shared), None when it publishes none (a store not
    started by ``training.rdzv_store``). Raises :class:`LaunchError` naming the endpoint when no store answers
    within ``connect_timeout_s``."""
    import torch.distributed as dist  # deferred: importing training.launch never imports torch

    from training.rdzv_store import JOB_ID_KEY

    host, _, port = endpoint.rpartition(":")
    try:
        client = dist.TCPStore(host, int(port), is_master=False,
                               timeout=datetime.timedelta(seconds=connect_timeout_s))
    except (RuntimeError, TimeoutError, ValueError) as e:  # DistNetworkError/DistStoreError are RuntimeErrors
        raise LaunchError(f"no rendezvous store answers at {endpoint} (waited {connect_timeout_s:.0f} s: "
                          f"{str(e).splitlines()[0][:200]}): start it (python -m training.rdzv_store) or point "
                          f"T5_RDZV_ENDPOINT / --rdzv-endpoint at the running one") from None
    try:
        client.wait([JOB_ID_KEY], datetime.timedelta(seconds=KEY_WAIT_S))
    except (RuntimeError, TimeoutError):
        return None
    return client.get(JOB_ID_KEY).decode()


def check_store(endpoint: str, rdzv_id: str, connect_timeout_s: float = 30.0) -> str | None:
    """Raise :class:`LaunchError` unless a store answers at ``endpoint`` and serves ``rdzv_id``; returns the
    store's job id ("" shared, None unknown)."""
    job = store_job_id(endpoint, connect_timeout_s)
    if job is not None and not serves(job, rdzv_id):
        raise LaunchError(f"store at {endpoint} serves job {job}; this agent's rendezvous id is {rdzv_id}: point "
                          f"T5_RDZV_ENDPOINT (--rdzv-endpoint) at this job's store, or set T5_RDZV_ID "
                          f"(--rdzv-id) to that job's id")
    return job

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

A shared store can still serve two jobs under one rendezvous id (``t5-local`` by default) by mistake: then
the agent exits 2 too (:func:`check_rendezvous`), when that id's rendezvous is closed (a job with the id ended
there; torch would raise RendezvousClosedError) or when another job, recognised by what its first agent
recorded (node counts, module, a digest of the training arguments), is alive in it; the agent would otherwise
wait silently as that job's spare, then fail after the join timeout.

The store is first reached with plain sockets (:func:`wait_for_listener`), so an unreachable one is one line
saying how long the agent waited and what to check, without torch's C++ frame dumps.

This is a guard against a mis-pointed endpoint, not authentication: any client that reaches the port can read
or overwrite the key (docs/failover.md, "Store security").
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import pickle
import re
import socket
import sys
import time

from training.launch.config import LaunchError

#: How long an agent waits for the job id key once connected: the store writes it right after it starts
#: listening, so only a store that is not ``training.rdzv_store`` (which never writes it) makes this wait.
KEY_WAIT_S = 2.0
#: Where the first agent of a job records what the job is (:func:`check_rendezvous`), per rendezvous id.
JOB_KEY = "t5f/rdzv/{rdzv_id}/job"
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


def wait_for_listener(endpoint: str, timeout_s: float) -> None:
    """Return once something accepts TCP connections at HOST:PORT; else raise :class:`LaunchError` saying how long
    it waited and what to check.

    Plain sockets, retried every 0.5 s: torch's TCPStore client would retry too, but it logs each failure with a
    page of C++ frames and waits longer than asked (random back-off), so the one line came after ~45-75 s.
    """
    host, _, port = endpoint.rpartition(":")
    start = time.monotonic()
    while True:
        left = start + timeout_s - time.monotonic()
        try:
            socket.create_connection((host, int(port)), timeout=max(0.5, min(5.0, left))).close()
            return
        except OSError as e:
            last = e
        if time.monotonic() - start >= timeout_s:
            break
        time.sleep(0.5)
    why = (
        "connection refused"
        if isinstance(last, ConnectionRefusedError)
        else f"host {host} does not resolve"
        if isinstance(last, socket.gaierror)
        else "no answer"
        if isinstance(last, TimeoutError)
        else last.strerror or str(last)
    )
    raise LaunchError(
        f"no rendezvous store answers at {endpoint} after {time.monotonic() - start:.0f} s ({why}): "
        f"check that it runs there (python -m training.rdzv_store --host {host} --port {port}; "
        f"python -m training.rdzv_store --check {endpoint} tests it), that {endpoint} is the right "
        f"endpoint (T5_RDZV_ENDPOINT / --rdzv-endpoint), and that no firewall or security group "
        f"blocks port {port} from this node"
    )


@contextlib.contextmanager
def _native_stderr_silenced():
    """Send file descriptor 2 to /dev/null for the block: torch's C++ store client writes its retries and frame
    dumps there, below Python (this process prints its own line about what went wrong)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def connect(endpoint: str, connect_timeout_s: float):
    """A TCPStore client of the store at HOST:PORT; :class:`LaunchError` (one line, no C++ frames) when none
    answers within ``connect_timeout_s`` or what answers is not a store."""
    import torch.distributed as dist  # deferred: importing training.launch never imports torch

    wait_for_listener(endpoint, connect_timeout_s)
    host, _, port = endpoint.rpartition(":")
    try:
        with _native_stderr_silenced():
            return dist.TCPStore(
                host, int(port), is_master=False, timeout=datetime.timedelta(seconds=connect_timeout_s)
            )
    except (RuntimeError, TimeoutError, ValueError) as e:  # DistNetworkError/DistStoreError are RuntimeErrors
        raise LaunchError(
            f"{endpoint} accepts connections but no rendezvous store answered there within "
            f"{connect_timeout_s:.0f} s ({str(e).splitlines()[0][:160]}): point T5_RDZV_ENDPOINT / "
            f"--rdzv-endpoint at the store (python -m training.rdzv_store)"
        ) from None


def published_job_id(client) -> str | None:
    """The job id the store publishes ("" = shared), None when it publishes none (a store not started by
    ``training.rdzv_store``)."""
    from training.rdzv_store import JOB_ID_KEY

    try:
        client.wait([JOB_ID_KEY], datetime.timedelta(seconds=KEY_WAIT_S))
    except (RuntimeError, TimeoutError):
        return None
    return client.get(JOB_ID_KEY).decode()


def store_job_id(endpoint: str, connect_timeout_s: float) -> str | None:
    """The job id the store at HOST:PORT publishes ("" = shared, None = none); :class:`LaunchError` naming the
    endpoint when no store answers within ``connect_timeout_s``."""
    return published_job_id(connect(endpoint, connect_timeout_s))


def rendezvous_state(client, rdzv_id: str):
    """torch's c10d rendezvous state of ``rdzv_id`` in the store (its ``_RendezvousState``), None before any
    agent joined. Read only: nothing is written under torch's key."""
    key = f"torch.rendezvous.{rdzv_id}"  # torch's C10dRendezvousBackend: base64 of the pickled state
    if not client.check([key]):
        return None
    try:
        return pickle.loads(base64.b64decode(client.get(key)))  # noqa: S301 - torch's own format, as standby reads it
    except Exception:  # noqa: BLE001 - torch's "no state yet" sentinel, or a format this torch does not know
        return None


def _newest_heartbeat_age(state) -> float | None:
    beats = list(getattr(state, "last_heartbeats", {}).values())
    if not beats:
        return None
    return (datetime.datetime.now(datetime.timezone.utc) - max(beats)).total_seconds()


def check_rendezvous(client, endpoint: str, rdzv_id: str, job: str, stale_after_s: float) -> None:
    """Refuse (:class:`LaunchError`) to join rendezvous ``rdzv_id`` when it is closed (a job with this id ended:
    torch would raise RendezvousClosedError) or when another job uses it now.

    ``job`` describes this agent's job (the same on every node of one job: sizes, module, a digest of the
    training arguments). The first agent of a job records it under :data:`JOB_KEY`; an agent whose ``job``
    differs while the rendezvous has a heartbeat younger than ``stale_after_s`` belongs to another job. A
    rendezvous whose agents all stopped heartbeating (a job that was killed) is taken over.
    """
    state = rendezvous_state(client, rdzv_id)
    if state is not None and state.closed:
        raise LaunchError(
            f"rendezvous {rdzv_id} at {endpoint} is closed: a job with this id ended there; give this "
            f"run a new id (--rdzv-id / T5_RDZV_ID, e.g. {rdzv_id}-2) or restart the store"
        )
    key = JOB_KEY.format(rdzv_id=rdzv_id)
    other = client.compare_set(key, "", job).decode()  # sets it when absent; returns what is there now
    if other == job:
        return
    age = _newest_heartbeat_age(state) if state is not None else None
    if age is None or age > stale_after_s:  # nobody is alive in it: a killed job's leftovers
        client.set(key, job)
        return
    raise LaunchError(
        f"store at {endpoint} is in use by another job under rendezvous id {rdzv_id} ({other}; "
        f"its last heartbeat {max(age, 0.0):.0f} s ago), not this one ({job}): give this job its own "
        f"id (--rdzv-id / T5_RDZV_ID) or its own store (--rdzv-endpoint / T5_RDZV_ENDPOINT)"
    )


def check_store(
    endpoint: str, rdzv_id: str, connect_timeout_s: float = 30.0, job: str | None = None, stale_after_s: float = 10.0
) -> str | None:
    """Raise :class:`LaunchError` unless a store answers at ``endpoint``, serves ``rdzv_id`` and (given ``job``,
    see :func:`check_rendezvous`) its rendezvous is open and not another job's; returns the store's job id ("" shared,
    None unknown)."""
    client = connect(endpoint, connect_timeout_s)
    store_job = published_job_id(client)
    if store_job is not None and not serves(store_job, rdzv_id):
        raise LaunchError(
            f"store at {endpoint} serves job {store_job}; this agent's rendezvous id is {rdzv_id}: point "
            f"T5_RDZV_ENDPOINT (--rdzv-endpoint) at this job's store, or set T5_RDZV_ID "
            f"(--rdzv-id) to that job's id"
        )
    if job is not None:
        check_rendezvous(client, endpoint, rdzv_id, job, stale_after_s)
    return store_job

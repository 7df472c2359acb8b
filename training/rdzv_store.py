"""Standalone rendezvous store: a torch ``TCPStore`` server that no training node hosts.

torchrun's c10d rendezvous normally runs its store inside the agent on the endpoint host, so losing that
node kills the whole job (pytorch#67742). Running the store as its own small process (a login/head node,
a CPU pod behind a Service, or a separate process on this machine) removes that single point of failure:
agents connect to it as clients (``--rdzv-conf ...,is_host=false``, see ``training.launch``) and any
training node, including the one with rank 0, can die and be replaced.

The store keeps only rendezvous state (membership, round, heartbeats): restarting it loses no training
state, but running jobs then fail their next rendezvous call and must be relaunched.

Usage::

    python -m training.rdzv_store --port 29400                    # loopback only, until SIGTERM/SIGINT
    python -m training.rdzv_store --host 10.0.1.5 --port 29400    # listen on this internal address only
    python -m training.rdzv_store --host 10.0.1.5 --job-id trainjob-t5-run1   # serve one job only
    python -m training.rdzv_store --port 0 --port-file P          # pick a free port, write it to P
    python -m training.rdzv_store --check HOST:PORT               # exit 0 when a store answers there

Binding: torch's TCPStore listens on every interface whatever ``host_name`` says (checked with ``ss -ltnp`` on
torch 2.13, libuv and legacy servers alike). This module binds the listening socket itself to ``--host`` and
hands it to the TCPStore (``master_listen_fd``), so ``--host 10.0.1.5`` is reachable on that address only and
the default, 127.0.0.1, from this machine only. ``--host 0.0.0.0`` listens on all interfaces.

Job pinning: the store writes its job id (empty for a shared store) under :data:`JOB_ID_KEY` before it
reports that it serves. Every agent of ``python -m training.launch`` reads it before it joins the rendezvous and
exits 2 when its rendezvous id belongs to another job (:mod:`training.launch.store_check`). This guards against
a mis-pointed endpoint, not against an attacker: TCPStore has no authentication (docs/failover.md, "Store
security").

Started by the local launcher (``python -m training.launch``), the store stops when the launcher exits, even
if it was SIGKILLed (``T5_DIE_WITH_PARENT``, :mod:`training.job.lifecycle`).
"""

from __future__ import annotations

import argparse
import datetime
import errno
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass

from training.job.lifecycle import die_with_launcher

#: Key under which the store publishes the job it serves ("" = shared by any job).
JOB_ID_KEY = "t5f/store/job_id"
DEFAULT_HOST = "127.0.0.1"


class StoreError(ValueError):
    """A store setting that cannot work here; the message names the value and the fix."""


@dataclass(frozen=True)
class StoreConfig:
    """Where the standalone store listens, and for which job.

    Attributes:
        host: the address the server binds to and listens on (only that one; 0.0.0.0 = all interfaces).
        port: TCP port; 0 picks a free one (then read it from ``port_file``).
        port_file: when set, the bound port is written here (atomically) once the store is serving.
        job_id: the one job (rendezvous id, see :func:`training.launch.store_check.serves`) this store is
            for; None = shared by any job.
    """

    host: str = DEFAULT_HOST
    port: int = 29400
    port_file: str | None = None
    job_id: str | None = None


def validate_job_id(job_id: str) -> None:
    """Raise :class:`StoreError` unless ``job_id`` could be a rendezvous id (the launcher's rule)."""
    if not job_id or any(c.isspace() or c in ",=" for c in job_id):
        raise StoreError(
            f"--job-id {job_id!r} must be non-empty without spaces, ',' or '=' "
            f"(use the job's rendezvous id, e.g. trainjob-<name>)"
        )


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; raises :class:`StoreError` naming the fix.

    Bound here rather than by torch because TCPStore ignores ``host_name`` for the server's bind.
    """
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise StoreError(
            f"--host {host!r} does not resolve ({e.strerror}): give an IP address of this "
            f"machine (ip -brief addr), or 0.0.0.0 for all interfaces"
        ) from None
    sock = socket.socket(family, type_, proto)
    # a restarted store must get its port back while old connections sit in TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            raise StoreError(
                f"--host {host} is not an address of this machine: use one of its addresses "
                f"(ip -brief addr), e.g. the internal one the training nodes reach, or 0.0.0.0 "
                f"for all interfaces"
            ) from None
        if e.errno == errno.EADDRINUSE:
            raise StoreError(
                f"port {port} on {host} is in use (another store?): stop it, or pick another --port"
            ) from None
        raise StoreError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def serve(cfg: StoreConfig, stop: threading.Event) -> int:
    """Host the store on ``cfg.host`` only until ``stop`` is set. Returns the port it served on.

    Raises :class:`StoreError` for an address that is not this machine's, a busy port or a bad job id.
    """
    if cfg.job_id is not None:
        validate_job_id(cfg.job_id)
    listener = bind_listener(cfg.host, cfg.port)
    import torch.distributed as dist  # deferred: keeps --help fast

    # wait_for_workers=False: the store must not wait for a fixed number of clients; agents come and go.
    # The store owns the listening socket from here on (it closes it): detach it from the Python object.
    store = dist.TCPStore(
        cfg.host,
        listener.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
        master_listen_fd=listener.detach(),
    )
    store.set(JOB_ID_KEY, cfg.job_id or "")  # before the port file: a client that finds the port finds it
    port = store.port
    if cfg.port_file:
        tmp = f"{cfg.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, cfg.port_file)  # readers never see a half-written file
    scope = f"job {cfg.job_id} only" if cfg.job_id else "any job (shared)"
    print(f"[rdzv-store] serving {scope} on {cfg.host}:{port} (pid {os.getpid()}); stop with SIGTERM", flush=True)
    stop.wait()
    print("[rdzv-store] stopping", flush=True)
    del store
    return port


def check(endpoint: str, timeout_s: float = 5.0) -> bool:
    """True when a TCPStore answers at HOST:PORT within ``timeout_s``."""
    import torch.distributed as dist

    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT (e.g. 127.0.0.1:29400)")
    try:
        client = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        client.set("rdzv_store/ping", "1")
        return True
    except (RuntimeError, TimeoutError):
        return False


def main(argv: list[str] | None = None) -> int:
    die_with_launcher(signal.SIGTERM)
    p = argparse.ArgumentParser(
        prog="python -m training.rdzv_store",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on, only that one (default {DEFAULT_HOST}: this machine only; a "
        f"cluster passes its internal address; 0.0.0.0 = all interfaces)",
    )
    p.add_argument("--port", type=int, default=29400, help="TCP port; 0 = pick a free one (default 29400)")
    p.add_argument("--port-file", help="write the bound port here once serving (useful with --port 0)")
    p.add_argument(
        "--job-id",
        help="serve only the job with this rendezvous id (e.g. trainjob-<name>, or the "
        "bare <name>); other jobs' agents exit 2. Default: shared by any job",
    )
    p.add_argument("--check", metavar="HOST:PORT", help="only test whether a store answers at HOST:PORT")
    a = p.parse_args(argv)
    if a.check:
        try:
            ok = check(a.check)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"[rdzv-store] {a.check}: {'up' if ok else 'NOT reachable'}")
        return 0 if ok else 1
    if not 0 <= a.port <= 65535:
        print(f"error: --port {a.port} is outside 0..65535", file=sys.stderr)
        return 2
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum, _frame):
        got.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        serve(StoreConfig(host=a.host, port=a.port, port_file=a.port_file, job_id=a.job_id), stop)
    except StoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Stopped by a signal: exit 128+N, as a killed process would. A store never finishes on its own, so a
    # supervisor must not read its stop as success (a Kubernetes Job would count a deleted store pod as done).
    return 128 + got[0] if got else 0


if __name__ == "__main__":
    sys.exit(main())

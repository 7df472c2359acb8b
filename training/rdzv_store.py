"""Standalone rendezvous store: a torch ``TCPStore`` server that no training node hosts.

torchrun's c10d rendezvous normally runs its store inside the agent on the endpoint host, so losing that
node kills the whole job (pytorch#67742). Running the store as its own small process (a login/head node,
a CPU pod behind a Service, or a separate process on this machine) removes that single point of failure:
agents connect to it as clients (``--rdzv-conf ...,is_host=false``, see ``training.launch``) and any
training node, including the one with rank 0, can die and be replaced.

The store keeps only rendezvous state (membership, round, heartbeats): restarting it loses no training
state, but running jobs then fail their next rendezvous call and must be relaunched.

Usage::

    python -m training.rdzv_store --port 29400            # serve until SIGTERM/SIGINT
    python -m training.rdzv_store --port 0 --port-file P  # pick a free port, write it to P
    python -m training.rdzv_store --check HOST:PORT       # exit 0 when a store answers there

Started by the local launcher (``python -m training.launch``), the store stops when the launcher exits, even
if it was SIGKILLed (``T5_DIE_WITH_PARENT``, :mod:`training.lifecycle`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
from dataclasses import dataclass

from training.lifecycle import die_with_launcher


@dataclass(frozen=True)
class StoreConfig:
    """Where the standalone store listens.

    Attributes:
        host: address clients use to reach the store; the server itself listens on all interfaces.
        port: TCP port; 0 picks a free one (then read it from ``port_file``).
        port_file: when set, the bound port is written here (atomically) once the store is serving.
    """

    host: str = "0.0.0.0"
    port: int = 29400
    port_file: str | None = None


def serve(cfg: StoreConfig, stop: threading.Event) -> int:
    """Host the store until ``stop`` is set. Returns the port it served on."""
    import torch.distributed as dist  # deferred: keeps --help fast

    # wait_for_workers=False: the store must not wait for a fixed number of clients; agents come and go.
    store = dist.TCPStore(cfg.host, cfg.port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    port = store.port
    if cfg.port_file:
        tmp = f"{cfg.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, cfg.port_file)  # readers never see a half-written file
    print(f"[rdzv-store] serving on port {port} (pid {os.getpid()}); stop with SIGTERM", flush=True)
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
        client = dist.TCPStore(host, int(port), is_master=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
        client.set("rdzv_store/ping", "1")
        return True
    except (RuntimeError, TimeoutError):
        return False


def main(argv: list[str] | None = None) -> int:
    die_with_launcher(signal.SIGTERM)
    p = argparse.ArgumentParser(prog="python -m training.rdzv_store", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--host", default="0.0.0.0", help="address to bind/advertise (default: all interfaces)")
    p.add_argument("--port", type=int, default=29400, help="TCP port; 0 = pick a free one (default 29400)")
    p.add_argument("--port-file", help="write the bound port here once serving (useful with --port 0)")
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
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(StoreConfig(host=a.host, port=a.port, port_file=a.port_file), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Support for the rendezvous probes (spare_probe.py, lost_node_probe.py): real torch c10d rendezvous handlers on
one TCP store, as agents' handlers in one process, and running a probe from a test.

A probe runs as its own process (``python tests/support/<probe>.py [fixed]``) so that a torch patch applied by
one run never leaks into the other, and prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def handlers(count: int, *, min_nodes: int, max_nodes: int, last_call_timeout: int) -> tuple[object, list]:
    """(the store server, ``count`` DynamicRendezvousHandlers of one run id) with the launcher's 1 s x 3 keep-alive;
    keep the server referenced while the handlers live."""
    # as the launcher sets it (training.launch.config); here only, in the probe's own process: set in a test
    # runner it would reach every later test's launches (it changed how test_stops_e2e's runs stop)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def handler():
        p = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{server.port}",
            run_id="probe",
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            is_host=False,
            join_timeout=30,
            last_call_timeout=last_call_timeout,
            close_timeout=5,
            keep_alive_interval=1,
            keep_alive_max_attempt=3,
        )
        backend, store = create_backend(p)
        return create_handler(store, backend, p)

    return server, [handler() for _ in range(count)]


def run_probe(script: Path, *args: str) -> dict:
    """Run a probe script and return its JSON line (the test fails with the probe's stderr if it failed)."""
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])

"""Simulated nodes on this machine: a standalone rendezvous store plus one torchrun agent per node.

Used by ``python -m training.launch`` (``--from-env local``) and by the chaos harness (:func:`start_store`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace

from training.launch.commands import format_argv, launch_env, store_argv, torchrun_argv
from training.launch.config import RDZV_ENV, LaunchConfig, LaunchError


def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def start_store(workdir: str, python: str = sys.executable, timeout_s: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start ``training.rdzv_store`` on a free port; returns (process, port) once it serves."""
    port_file = os.path.join(workdir, "rdzv_store.port")
    proc = subprocess.Popen(store_argv(0, port_file, python), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            raise LaunchError(f"rendezvous store exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LaunchError(f"rendezvous store did not start within {timeout_s:.0f} s")
        time.sleep(0.05)
    with open(port_file) as f:
        return proc, int(f.read())


def run_local(cfg: LaunchConfig, nodes: int, own_store_needed: bool = True) -> int:
    """Run ``nodes`` agents on this machine against a standalone store; returns the job's exit code.

    With ``own_store_needed`` a store is started on a free port (and stopped at the end); otherwise
    ``cfg.rdzv_endpoint`` must already serve one.
    """
    own_store = None
    workdir = tempfile.mkdtemp(prefix="t5-launch-")
    if own_store_needed:
        own_store, port = start_store(workdir, cfg.python)
        cfg = replace(cfg, rdzv_endpoint=f"127.0.0.1:{port}")
        print(f"[launch] rendezvous store pid {own_store.pid} on 127.0.0.1:{port}", flush=True)
    argv, env = torchrun_argv(cfg), launch_env(cfg)
    print(f"[launch] {nodes} node(s): {format_argv(argv, RDZV_ENV)}", flush=True)
    agents = []
    for i in range(nodes):
        # a new session per agent: a terminal's Ctrl-C reaches us once, and we forward it explicitly
        p = subprocess.Popen(argv, env=dict(env, T5_NODE_RANK=str(i)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=_pump, args=(p.stdout, f"[node{i}] "), daemon=True).start()
        agents.append(p)

    def forward(signum, _frame):
        print(f"[launch] got signal {signum}: forwarding to {nodes} agent(s)", flush=True)
        for p in agents:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    codes = [p.wait() for p in agents]
    if own_store is not None:
        own_store.terminate()
        own_store.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)
    for i, c in enumerate(codes):
        if c:
            print(f"[launch] node{i} exited with {c}" + (" (restarts exhausted or a worker failed for good; "
                  "checkpoints are kept, rerun to resume)" if c == 1 else ""), flush=True)
    bad = [c for c in codes if c]
    return bad[0] if bad else 0

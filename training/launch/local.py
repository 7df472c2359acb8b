"""Simulated nodes on this machine: the membership (3 etcd members on loopback, :func:`start_etcd`; with
``T5_COORDINATOR=store`` a standalone c10d store, :func:`start_store`) plus one torchrun agent per node.

Used by ``python -m training.launch`` (``--from-env local``) and by the chaos harness (:func:`start_store`).

Agents and the store run in their own sessions, so a terminal's Ctrl-C reaches the launcher alone, which
forwards it to the agents: the first SIGINT (or SIGTERM) makes the workers checkpoint at the next step and
exit, a second SIGINT stops everything at once. If the launcher itself dies (even by SIGKILL), the kernel
sends SIGTERM to the agents and the store (:func:`training.job.lifecycle.die_with_launcher`), and the agents
stop their workers the clean way.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

from training.config import DEFAULT_MEMORY_DIR, MEMORY_DIR_ENV
from training.launch.commands import format_argv, launch_env, store_argv, torchrun_argv
from training.launch.config import RDZV_ENV, LaunchConfig, LaunchError
from training.launch.workdir import make_workdir
from training.job.lifecycle import PARENT_ENV


def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def start_store(
    workdir: str, python: str = sys.executable, timeout_s: float = 60.0, die_with_us: bool = False
) -> tuple[subprocess.Popen, int]:
    """Start ``training.rdzv_store`` on a free port; returns (process, port) once it serves.

    It runs in its own session (a terminal's Ctrl-C must not stop it before the agents are done with it);
    ``die_with_us``: it gets SIGTERM when this process exits, however that happens.
    """
    port_file = os.path.join(workdir, "rdzv_store.port")
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())}) if die_with_us else None
    proc = subprocess.Popen(
        store_argv(0, port_file, python),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
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


def start_etcd(workdir: str, cfg: LaunchConfig):
    """Start 3 etcd members under ``workdir`` (they die with this process) and a user for this job; returns the
    cluster and ``cfg`` pointing the agents at it."""
    from training.launch.rendezvous.members import LocalEtcd

    etcd = LocalEtcd.start(os.path.join(workdir, "etcd"), die_with_parent=True)
    creds = etcd.add_job_user(cfg.rdzv_id)
    host_port = creds.endpoints[0].split("//", 1)[1]
    cfg = replace(cfg, rdzv_endpoint=host_port, etcd_env=tuple(sorted(creds.as_env().items())))
    print(
        f"[launch] membership: etcd members {', '.join(e.split('//', 1)[1] for e in creds.endpoints)} "
        f"(TLS, etcd user {creds.user})",
        flush=True,
    )
    return etcd, cfg


def run_local(cfg: LaunchConfig, nodes: int, own_store_needed: bool = True) -> int:
    """Run ``nodes`` agents (plus ``cfg.spares`` hot spares) on this machine against a standalone store;
    returns the job's exit code.

    With ``own_store_needed`` a store is started on a free port (and stopped at the end); otherwise
    ``cfg.rdzv_endpoint`` must already serve one. Call it from the main thread (signal handlers, and see
    :mod:`training.job.lifecycle` on which thread starts the children).
    """
    agents: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        name = signal.Signals(signum).name
        if received.count(signal.SIGINT) > 1:
            print(f"[launch] {name} again: stopping at once, without a checkpoint", flush=True)
        elif len(received) == 1:
            print(
                f"[launch] {name}: the workers checkpoint at the next step and exit"
                + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""),
                flush=True,
            )
        for p in agents:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)  # before anything starts: a signal during start-up starts no more agents
    own_store = None
    workdir = make_workdir(say=lambda line: print(line, flush=True))  # and a killed launcher's are removed
    etcd = None
    if own_store_needed and cfg.coordinator == "etcd":
        try:
            etcd, cfg = start_etcd(workdir, cfg)
        except LaunchError as e:  # no etcd binary, or members that would not start: one line, nothing ran
            print(f"error: {e}", file=sys.stderr, flush=True)
            shutil.rmtree(workdir, ignore_errors=True)
            return 2
    elif own_store_needed:
        own_store, port = start_store(workdir, cfg.python, die_with_us=True)
        cfg = replace(cfg, rdzv_endpoint=f"127.0.0.1:{port}")
        print(f"[launch] rendezvous store pid {own_store.pid} on 127.0.0.1:{port}", flush=True)
    argv, env = torchrun_argv(cfg), launch_env(cfg)
    print(f"[launch] {nodes} node(s): {format_argv(argv, RDZV_ENV)}", flush=True)
    if cfg.spares:
        print(
            f"[launch] + {cfg.spares} hot spare(s): the first {nodes} agents to join train, the others wait in "
            f"the rendezvous and replace a lost node",
            flush=True,
        )
    env[PARENT_ENV] = str(os.getpid())  # the agents get SIGTERM if this process dies, even by SIGKILL
    for i in range(nodes + cfg.spares):
        if received:
            break
        # a new session per agent: a terminal's Ctrl-C reaches us once, and we forward it explicitly
        # each simulated node its own "node memory" for in-memory snapshots (a real node has its /dev/shm)
        memory = os.path.join(os.environ.get(MEMORY_DIR_ENV) or DEFAULT_MEMORY_DIR, f"node{i}")
        p = subprocess.Popen(
            argv,
            env=dict(env, T5_NODE_RANK=str(i), **{MEMORY_DIR_ENV: memory}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=_pump, args=(p.stdout, f"[node{i}] "), daemon=True).start()
        agents.append(p)
    codes = [p.wait() for p in agents]
    if own_store is not None:
        own_store.terminate()
        own_store.wait(timeout=30)
    if etcd is not None:
        etcd.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    if received:
        return _stopped(received)
    for i, c in enumerate(codes):
        if c:
            print(
                f"[launch] node{i} exited with {c}"
                + (
                    " (restarts exhausted or a worker failed for good; checkpoints are kept, rerun to resume)"
                    if c == 1
                    else ""
                ),
                flush=True,
            )
    bad = [c for c in codes if c]
    return bad[0] if bad else 0


def _stopped(received: list[int]) -> int:
    """One line and the exit code (128+signum) after a stop we forwarded."""
    sig = signal.Signals(received[0])
    if received.count(signal.SIGINT) > 1:
        print(
            "[launch] stopped at once by a second SIGINT; rerun to resume from the last complete checkpoint (exit 130)",
            flush=True,
        )
        return 128 + signal.SIGINT
    print(f"[launch] stopped by {sig.name}; run the same command again to resume (exit {128 + sig})", flush=True)
    return 128 + sig

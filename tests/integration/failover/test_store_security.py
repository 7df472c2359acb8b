"""Standalone store security: the bind address is honoured and a store pinned to one job refuses another's agents.

Every test runs real processes: ``python -m training.rdzv_store`` and, for the job id, torchrun's agent
(``python -m training.launch.agent``) against it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.launch.config import LaunchError
from training.launch.store_check import check_store, serves

ROOT = Path(__file__).resolve().parents[3]


def start_store(tmp_path: Path, host: str | None, *extra: str) -> tuple[subprocess.Popen, int]:
    """A real store process on ``host`` (None: the default) with a free port; returns (process, port) once it
    serves."""
    port_file = tmp_path / f"port-{host}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.rdzv_store",
            *(["--host", host] if host else []),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "store did not start in 60 s"
        time.sleep(0.05)
    return proc, int(port_file.read_text())


@pytest.fixture
def store(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(host: str = "127.0.0.2", *extra: str) -> int:
        proc, port = start_store(tmp_path, host, *extra)
        procs.append(proc)
        return port

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


def connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def agent_argv(
    endpoint: str, rdzv_id: str, read_timeout: int = 10, nnodes: str = "1", module: str = "site"
) -> list[str]:
    """torchrun's agent as every platform runs it, workers running ``python -m MODULE`` (site: exits 0)."""
    return [
        sys.executable,
        "-m",
        "training.launch.agent",
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host=false,read_timeout={read_timeout},join_timeout=20,last_call_timeout=1,"
        f"keep_alive_interval=1,keep_alive_max_attempt=3",
        "--max-restarts=0",
        "--module",
        module,
    ]


AGENT_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def agent(endpoint: str, rdzv_id: str, read_timeout: int = 10, **kw) -> subprocess.CompletedProcess:
    """One agent run to its end (one node by default)."""
    return subprocess.run(
        agent_argv(endpoint, rdzv_id, read_timeout, **kw),
        cwd=ROOT,
        env=AGENT_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- bind address ----------------------------------------------------------------------------------------


def test_store_listens_on_its_host_only(store):
    """Bound to 127.0.0.2, the port is closed on 127.0.0.1 (Linux routes all of 127/8 to lo, so a store
    listening on every interface, torch's own behaviour, would answer there)."""
    port = store("127.0.0.2")
    assert connects("127.0.0.2", port)
    assert not connects("127.0.0.1", port)


def test_default_host_is_loopback(tmp_path):
    proc, port = start_store(tmp_path, None)
    try:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
        assert [line.split()[3] for line in out.splitlines()] == [f"127.0.0.1:{port}"], out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_address_not_on_this_machine_is_a_clear_error():
    r = subprocess.run(
        [sys.executable, "-m", "training.rdzv_store", "--host", "192.0.2.1", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "--host 192.0.2.1 is not an address of this machine" in r.stderr


# --- job id ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "store_id, rdzv_id, ok",
    [
        ("", "anything", True),
        ("t5-run1", "t5-run1", True),
        ("t5-run1", "trainjob-t5-run1", True),
        ("trainjob-t5-run1", "trainjob-t5-run1", True),
        ("4242", "slurm-4242", True),
        ("4242", "slurm-4242-r3", True),
        ("slurm-4242", "slurm-4242-r3", True),
        ("t5-run1", "trainjob-t5-run2", False),
        ("t5-run1", "t5-run10", False),
        ("4242", "slurm-42421", False),
        ("t5-run1", "trainjob-t5-run1-r1", False),  # -rN is a requeue only in Slurm ids
    ],
)
def test_matching_rule(store_id, rdzv_id, ok):
    assert serves(store_id, rdzv_id) is ok


def test_agent_of_another_job_is_refused_before_the_rendezvous(store):
    port = store("127.0.0.2", "--job-id", "trainjob-job-a")
    r = agent(f"127.0.0.2:{port}", "trainjob-job-b")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        f"store at 127.0.0.2:{port} serves job trainjob-job-a; this agent's rendezvous id is trainjob-job-b" in r.stderr
    )
    assert "Rendezvous" not in r.stderr + r.stdout  # refused before torch's rendezvous started
    # and it left nothing in that job's store: no rendezvous state under its id
    from datetime import timedelta

    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.2", port, is_master=False, timeout=timedelta(seconds=5))
    assert not client.check(["torch.rendezvous.trainjob-job-b"])


def test_agent_of_the_pinned_job_trains(store):
    port = store("127.0.0.2", "--job-id", "job-a")
    r = agent(f"127.0.0.2:{port}", "trainjob-job-a")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "serves job" not in r.stderr


def test_shared_store_serves_any_job(store):
    port = store("127.0.0.2")
    assert check_store(f"127.0.0.2:{port}", "slurm-1", connect_timeout_s=10) == ""
    assert check_store(f"127.0.0.2:{port}", "trainjob-x", connect_timeout_s=10) == ""


def test_pinned_store_check_in_process(store):
    port = store("127.0.0.2", "--job-id", "4242")
    assert check_store(f"127.0.0.2:{port}", "slurm-4242-r1", connect_timeout_s=10) == "4242"
    with pytest.raises(LaunchError, match="serves job 4242; this agent's rendezvous id is slurm-77"):
        check_store(f"127.0.0.2:{port}", "slurm-77", connect_timeout_s=10)


def test_unreachable_store_names_the_endpoint(store):
    """One line after the connect timeout, saying how long it waited and what to check; none of torch's C++
    frame dumps (the client's retries printed pages of them, and the line came ~45-75 s after a 30 s timeout)."""
    port = store("127.0.0.2")  # a live store, but on another address than the agent dials
    t0 = time.monotonic()
    r = agent(f"127.0.0.1:{port}", "trainjob-x", read_timeout=2)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(
        f"error: no rendezvous store answers at 127.0.0.1:{port} after 2 s (connection "
        f"refused): check that it runs there"
    ), r.stderr
    assert "firewall or security group" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "frame #" not in r.stdout + r.stderr
    assert took < 2 + 30  # the timeout it was given, plus starting Python and importing torch


def test_a_closed_rendezvous_is_refused_with_the_fix(store):
    """A job that ended closed its rendezvous for good: a new run under the same id on that store is told to
    take a new id (it used to get torch's RendezvousClosedError traceback, and 'rerun to resume')."""
    endpoint = f"127.0.0.2:{store('127.0.0.2')}"
    first = agent(endpoint, "t5-local")
    assert first.returncode == 0, first.stdout + first.stderr
    again = agent(endpoint, "t5-local")
    assert again.returncode == 2, again.stdout + again.stderr
    assert again.stderr == (
        f"error: rendezvous t5-local at {endpoint} is closed: a job with this id ended there; "
        f"give this run a new id (--rdzv-id / T5_RDZV_ID, e.g. t5-local-2) or restart the "
        f"store\n"
    )


def test_another_live_job_under_the_same_id_is_refused(store, tmp_path):
    """Two jobs pointed at one shared store with the default id: the second one's agent exits 2 naming the
    other job, at once and without touching it (it used to wait silently as that job's spare, then fail after
    the join timeout with a traceback); an agent of the same job (a replacement node) is not refused."""
    from datetime import timedelta

    import torch.distributed as dist
    from training.launch.store_check import rendezvous_state

    (tmp_path / "waiter.py").write_text("import sys\nsys.stdin.read()\n")  # runs until its agent stops it
    endpoint = f"127.0.0.2:{store('127.0.0.2')}"
    env = {**AGENT_ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    running = subprocess.Popen(
        agent_argv(endpoint, "t5-local", nnodes="1:2", module="waiter"),
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = dist.TCPStore(
            "127.0.0.2", int(endpoint.rpartition(":")[2]), is_master=False, timeout=timedelta(seconds=10)
        )
        deadline = time.monotonic() + 120
        while not ((st := rendezvous_state(client, "t5-local")) is not None and st.complete):
            assert running.poll() is None and time.monotonic() < deadline, running.stdout.read()
            time.sleep(0.1)
        other = subprocess.run(
            agent_argv(endpoint, "t5-local", nnodes="1", module="waiter"),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.returncode == 2, other.stdout + other.stderr
        assert other.stderr.startswith(
            f"error: store at {endpoint} is in use by another job under rendezvous id "
            f"t5-local (nnodes 1:2, nproc 1, -m waiter, arguments "
        ), other.stderr
        assert "not this one (nnodes 1, nproc 1, -m waiter" in other.stderr and other.stderr.count("\n") == 1
        assert running.poll() is None  # the running job goes on
        st = rendezvous_state(client, "t5-local")
        assert len(st.participants) == 1 and not st.wait_list and not st.redundancy_list  # it never joined
        # an agent of the running job itself (a replacement node: the same description) passes
        assert check_store(endpoint, "t5-local", 10, job=client.get("t5f/rdzv/t5-local/job").decode()) == ""
    finally:
        running.terminate()
        running.wait(timeout=60)


def test_a_stopped_store_does_not_exit_as_a_success(tmp_path):
    """A store never finishes on its own: SIGTERM/SIGINT end it with 128+signal, so a supervisor (a Kubernetes
    Job whose store pod was deleted or drained) does not count the stop as a completed store."""
    import signal as _signal

    for sig in (_signal.SIGTERM, _signal.SIGINT):
        (tmp_path / sig.name).mkdir()
        proc, _ = start_store(tmp_path / sig.name, None)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig, proc.stdout.read()

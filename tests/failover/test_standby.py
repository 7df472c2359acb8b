"""training.launch.standby on real c10d rendezvous handlers: a standby waits until the round is complete with
every training node (then it would land on the redundancy list as the spare), and joins anyway after its
timeout."""
import os
import subprocess
import sys
import threading
import time

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from tests.conftest import ROOT
from training.launch.standby import read_round, wait_for_full_round


@pytest.fixture
def server():
    s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield s
    del s


def handler(port: int, run_id: str):
    p = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=2,
                             max_nodes=2, is_host=False, join_timeout=30, last_call_timeout=1, close_timeout=5)
    backend, store = create_backend(p)
    return create_handler(store, backend, p)


def test_waits_for_the_full_round_then_returns(server):
    ep, said = f"127.0.0.1:{server.port}", []
    assert read_round(server, "job-a") is None
    assert wait_for_full_round(ep, "job-a", 2, timeout_s=0.5, say=said.append) is False  # nobody joined yet
    assert "joining now" in said[-1]
    hs = [handler(server.port, "job-a") for _ in range(2)]
    t = threading.Thread(target=hs[0].next_rendezvous, daemon=True)
    t.start()
    time.sleep(0.5)
    r = read_round(server, "job-a")
    assert r is not None and not r.complete and r.participants == 1, r
    assert wait_for_full_round(ep, "job-a", 2, timeout_s=0.5, say=said.append) is False  # 1 of 2: not formed
    threading.Thread(target=hs[1].next_rendezvous, daemon=True).start()
    t0 = time.monotonic()
    assert wait_for_full_round(ep, "job-a", 2, timeout_s=20, say=said.append) is True
    assert time.monotonic() - t0 < 10
    assert "formed with 2 node(s)" in said[-1]
    r = read_round(server, "job-a")
    assert r.complete and r.participants == 2
    # another job's round on the same (shared) store is not this job's
    assert wait_for_full_round(ep, "job-b", 2, timeout_s=0.3, say=said.append) is False


def test_cli_rejects_a_bad_setting():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "T5_"))}
    out = subprocess.run([sys.executable, "-m", "training.launch.standby", "--from-env", "slurm"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "SLURM_NNODES is not set" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "training.launch.standby", "--from-env", "slurm", "--timeout", "0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--timeout 0" in out.stderr, out.stderr

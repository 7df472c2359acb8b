"""A live process group's timeout is shortened in place through the public ``ProcessGroup.set_timeout``: the
progress tracker (a hung peer fails the step in seconds, not gloo's 30-minute default) and the checkpoint
collectives' bound rely on it. A collective whose peer never comes raises within the new bound."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

PEER = """import sys, time, torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 2), rank=1, world_size=2)
time.sleep(float(sys.argv[2]))  # in no collective: rank 0's all_reduce waits for it
"""


def test_a_shortened_timeout_ends_a_collective_whose_peer_never_comes(tmp_path):
    peer_sleeps_s = 30.0
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(tmp_path / "store"), str(peer_sleeps_s)])
    try:
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 2), rank=0, world_size=2)
        try:
            dist.group.WORLD.set_timeout(timedelta(seconds=1))
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1))
                raised = False
            except RuntimeError:
                raised = True
            waited = time.monotonic() - t0
        finally:
            dist.destroy_process_group()
    finally:
        peer.kill()
        peer.wait()
    assert raised, "the all_reduce completed without its peer"
    assert waited < peer_sleeps_s / 3, f"waited {waited:.1f} s: the 1 s timeout was not applied"

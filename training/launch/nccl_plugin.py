"""Does NCCL's network plugin load on this node? Asked once per node before the workers start.

On an EFA node NCCL reaches the network through the aws-ofi-nccl plugin (``libnccl-net.so``). When the dynamic
loader cannot load it (not on ``LD_LIBRARY_PATH`` or in the ld.so cache, or a library it needs is missing),
NCCL falls back to TCP sockets over the ENA interface without a word at ``NCCL_DEBUG=WARN``: the job trains,
several times slower between nodes. This turns that into one warning line naming the fix::

    warning = missing_plugin_warning()      # None: no RDMA device here, or the plugin loads
    if warning:
        print(f"[launch] {warning}", file=sys.stderr)

The check loads the library in a child process (the same loader NCCL uses, without bringing libfabric into the
agent that later forks the workers); it costs a few tens of milliseconds and runs only where RDMA devices exist.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from typing import Mapping

from cluster_facts import EFA_LIBRARY_DIRS, NCCL_NET_PLUGIN_LIBRARY

RDMA_DEVICE_DIR = "/dev/infiniband"  # the EFA device plugin (EKS) and the AMI (Slurm) expose uverbsN here


def rdma_devices(device_dir: str = RDMA_DEVICE_DIR) -> list[str]:
    """The RDMA user-verbs devices this process can see (EFA interfaces on AWS), sorted."""
    return sorted(glob.glob(os.path.join(device_dir, "uverbs*")))


def plugin_library(env: Mapping[str, str]) -> str | None:
    """The library NCCL will try to load under ``env``, as NCCL_NET_PLUGIN selects it (None: plugins off)."""
    chosen = env.get("NCCL_NET_PLUGIN", "").strip()
    if not chosen:
        return NCCL_NET_PLUGIN_LIBRARY
    if chosen.lower() == "none":
        return None
    return chosen if ".so" in chosen else f"libnccl-net-{chosen}.so"


def load_error(library: str, env: Mapping[str, str] | None = None) -> str | None:
    """None when the dynamic loader loads ``library`` in a fresh process with ``env`` (default: this one's),
    else the loader's reason (e.g. "libnccl-net.so: cannot open shared object file: No such file or directory")."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", library],
            env=dict(os.environ if env is None else env),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the check could not run: {e}"
    if r.returncode == 0:
        return None
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {r.returncode}"
    return last.split("OSError: ", 1)[-1]


def missing_plugin_warning(device_dir: str = RDMA_DEVICE_DIR, env: Mapping[str, str] | None = None) -> str | None:
    """A warning when this node has RDMA devices but NCCL's network plugin does not load; None otherwise."""
    env = os.environ if env is None else env
    devices = rdma_devices(device_dir)
    library = plugin_library(env)
    if not devices or library is None:
        return None
    reason = load_error(library, env)
    if reason is None:
        return None
    present = [d for d in EFA_LIBRARY_DIRS if os.path.isdir(d)]
    where = (
        f"this node has {', '.join(present)}"
        if present
        else f"none of the usual places exists here: {', '.join(EFA_LIBRARY_DIRS)}"
    )
    return (
        f"warning: this node has {len(devices)} RDMA device(s) ({devices[0]}{', ...' if len(devices) > 1 else ''})"
        f" but NCCL's network plugin does not load ({reason}): NCCL will carry the traffic between nodes over "
        f"TCP sockets, several times slower than EFA. Fix: put the aws-ofi-nccl library directory on "
        f"LD_LIBRARY_PATH ({where}), or run the training image"
    )

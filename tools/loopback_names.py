"""Loopback peers named without DNS, for simulations that put hundreds of TCPStore clients on one machine.

torch's ``TCPStore`` looks up the name of every peer (``getnameinfo`` without ``NI_NUMERICHOST``: a reverse DNS
query): a client for the address it connects to, the server for each connection it accepts, in its one
event-loop thread, before it answers that connection. Its sockets are IPv6 (dual stack), so a loopback peer is
``::ffff:127.0.0.1``, which ``/etc/hosts`` (``127.0.0.1 localhost``) does not name: each connect sends a query to
the machine's DNS server. This machine's (and CI's) DNS server drops part of a burst of those queries. Each
dropped query holds the store's loop for the resolver's timeout, and every connection behind it waits (seen
with ``strace``: ``poll(..., 5000) = 0 (Timeout)`` on port 53 in the store's thread).

Measured 2026-11-27, one TCPStore (libuv; the classic server alike), N clients of one process connecting at
once, seconds until the last was answered:

| N | machine resolver | resolver timeout 1 s (``RES_OPTIONS``) | loopback named here |
|---:|---|---|---|
| 64 | 10.0 (median 5.0) | 1.1 | 0.01 |
| 128 | 36 of 128 timed out at 10 s | - | 0.02 |
| 512 | - | 1.05 | 0.12 |
| 1,024 | - | - | 0.34 |

Real nodes ask their VPC's resolver, which answers for private addresses; their lookups are the store's cost,
not this machine's artifact. :func:`run_named` runs a command in a private mount namespace whose ``/etc/hosts``
also names the v4-mapped loopback address (nothing outside that namespace sees it)::

    if not loopback_names.named_here() and loopback_names.unavailable() is None:
        return loopback_names.run_named([sys.executable, "-m", "tools.rdzv_scale", *argv])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

#: Set in the namespace's environment: this process already runs with loopback named (do not run again).
MARKER = "T5_LOOPBACK_NAMED"
#: What the namespace's /etc/hosts adds to the machine's.
EXTRA_HOSTS = "::ffff:127.0.0.1 localhost\n"
_BIND_AND_RUN = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'


def named_here() -> bool:
    """Whether this process runs in such a namespace (set up by :func:`run_named`)."""
    return os.environ.get(MARKER) == "1"


def unavailable() -> str | None:
    """Why a namespace cannot be made here (not root, no ``unshare``, mounts refused), or None if it can."""
    if os.geteuid() != 0:
        return "not root (a private mount namespace needs it)"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --mount refused: {probe.stderr.strip() or probe.returncode}"
    return None


def hosts_text(machine_hosts: str) -> str:
    """The namespace's /etc/hosts: the machine's, and the v4-mapped loopback address named."""
    return machine_hosts.rstrip("\n") + "\n" + EXTRA_HOSTS if machine_hosts.strip() else EXTRA_HOSTS


def run_named(cmd: list[str]) -> int:
    """Run ``cmd`` in a private mount namespace with :func:`hosts_text` as /etc/hosts, :data:`MARKER` set; its exit
    status. The namespace (and the bind mount) end with the command."""
    with open("/etc/hosts") as f:
        text = hosts_text(f.read())
    with tempfile.TemporaryDirectory(prefix="t5-hosts-") as d:
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write(text)
        os.chmod(hosts, 0o644)
        wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _BIND_AND_RUN, "sh", hosts, *cmd]
        return subprocess.call(wrapped, env=os.environ | {MARKER: "1"})

"""Two notes between a node's agent and its workers, as files in the node-local heartbeat directory
(``$T5F_HEARTBEAT_DIR``, made by the agent's :class:`training.job.watchdog.NodeWatchdog`). Torch-free: the agent
imports it before torch.

* ``spares``: the number of hot spares waiting in the rendezvous, written by the agent's rendezvous handler
  (:mod:`training.launch.rendezvous.handler`) whenever the round record's count changes; read by the workers'
  straggler watch (:mod:`training.job.stragglers`) to decide between taking a slow node out and only naming it.
* ``take-out``: written by a worker of a node the job takes out (a straggler, with a spare waiting) right before it
  exits; its agent finds it when torchrun asks for the next round, leaves the job instead of joining, and says why.
* ``cut-<pid>``: written by the agent of a ``failover.in_place`` job for a worker left blocked in a collective of an
  epoch its peers left (:mod:`training.launch.inplace_agent`): the epoch, then why. The worker's in-place watcher
  reads it and cuts that epoch's group (:meth:`training.job.inplace.group.InPlaceGroup.cut`), so its collective
  raises and it recovers in its process; the agent kills it only if it has not checked in a grace period later.

Without the directory (a plain ``python -m training``, another launcher) there is no spare and nothing to leave.
"""

from __future__ import annotations

import os

#: Set by the agent for its workers (training.job.watchdog.HEARTBEAT_DIR_ENV; repeated here to stay torch-free).
HEARTBEAT_DIR_ENV = "T5F_HEARTBEAT_DIR"
SPARES_FILE = "spares"
TAKE_OUT_FILE = "take-out"
CUT_FILE = "cut-{pid}"


def _path(name: str) -> str:
    d = os.environ.get(HEARTBEAT_DIR_ENV, "")
    return os.path.join(d, name) if d and os.path.isdir(d) else ""


def publish_spares(count: int) -> None:
    """Agent: the number of hot spares now waiting (atomic replace; nothing without the directory)."""
    path = _path(SPARES_FILE)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(str(int(count)))
        os.replace(tmp, path)


def spares_waiting() -> int:
    """Worker: the spare count its agent last published (0 when none was, or off an agent of this launcher)."""
    path = _path(SPARES_FILE)
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def request_take_out(reason: str) -> bool:
    """Worker: ask this node's agent to leave the job at its next round (the reason is its line). False when
    there is no agent of this launcher to ask."""
    path = _path(TAKE_OUT_FILE)
    if not path:
        return False
    with open(path, "w") as f:
        f.write(reason.strip() + "\n")
    return True


def take_out_request() -> str | None:
    """Agent: the reason a worker of this node left to take it out of the job, or None (the note stays, so
    every later question gets the same answer)."""
    path = _path(TAKE_OUT_FILE)
    try:
        with open(path) as f:
            return f.read().strip() or "taken out"
    except OSError:
        return None


def request_cut(pid: int, epoch: int, reason: str) -> bool:
    """Agent: ask worker ``pid`` to cut its process group of ``epoch`` (atomic replace). False without the
    directory (nobody to ask: the agent's kill is all there is)."""
    path = _path(CUT_FILE.format(pid=int(pid)))
    if not path:
        return False
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{int(epoch)}\n{reason.strip()}\n")
    os.replace(tmp, path)
    return True


def cut_request(pid: int | None = None) -> tuple[int, str] | None:
    """Worker: the epoch whose group its agent asked it to cut and why, or None (this process's by default)."""
    path = _path(CUT_FILE.format(pid=os.getpid() if pid is None else int(pid)))
    if not path:
        return None
    try:
        with open(path) as f:
            epoch, _, reason = f.read().partition("\n")
        return int(epoch), reason.strip()
    except (OSError, ValueError):
        return None

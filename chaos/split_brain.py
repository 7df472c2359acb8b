"""The split-brain fault as a harness injects it from outside the job: freeze the torchrun agents of the training
nodes, hold the job until the spares run a second worker group, let go, thaw the agents.

Shared by the Slurm lab (:mod:`chaos.slurm_split_brain`) and the Kubernetes contract emulator
(:mod:`testbed.k8s_emulator`, fault ``freeze-agents:training@N``); each finds the agents and workers its own way
(Slurm's node process lists, the emulator's pod process trees) and hands them to :func:`freeze_agents`. The local
harness runs the same phases through its own cluster (:mod:`chaos.local.split_brain`, which also holds the verdict
every platform shares, :func:`chaos.local.split_brain.check_stale_group_fenced`).

The phases: the job's hold file is created (``--fault.hold_file``: every rank waits after its next step while it
exists), the agents (only) are SIGSTOPped: their workers train on, a group whose agents are gone from etcd, while
the agents' leases end and the spares form the job's next round. Once every spare runs workers (the second group)
the hold file goes: the old group reaches its next commit, which the commit fence refuses (one line, exit 9).
Once the old group's workers are gone the agents are let go (SIGCONT) and end with their workers' exit code.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from training.launch.rendezvous.members import process_state

#: The job's hold file (``--fault.hold_file``), in its run directory: every rank waits after its step while it exists.
HOLD_FILE = "hold-after-step"
#: Longest wait for each phase: the spares' round to form (a lease's expiry, then a round), the old group to exit.
PHASE_TIMEOUT_S = 180.0
AGENT_MODULE = "training.launch.agent"
_GONE = (None, "Z", "X")


def _cmdline(pid: int | None) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def agent_pid(pids: set[int]) -> int | None:
    """The torchrun agent among a node's processes: it runs ``training.launch.agent`` and its parent (the node
    agent's bash, the pod's runtime) does not; its warm workers' forkserver, forked from it, has the same command
    line."""
    agents = [
        p
        for p in pids
        if AGENT_MODULE in _cmdline(p) and (pp := _ppid(p)) is not None and AGENT_MODULE not in _cmdline(pp)
    ]
    return min(agents) if agents else None


def wait_until(pred: Callable[[], object], timeout_s: float, poll_s: float = 0.2):
    """``pred()``'s first true value, or its last (false) one once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(poll_s)


@dataclass
class Freeze:
    """What :func:`freeze_agents` saw.

    Attributes:
        agents: the frozen agents (node or pod name -> pid).
        stopped: per agent, whether the kernel showed it stopped after the SIGSTOP.
        workers: the old group's workers -> their process state right after the stop (they must run on).
        second_group_s: seconds from the stop until every spare ran workers (None: they never did).
        old_group_exited_s: seconds from the stop until the old group's workers were gone (None: still there).
    """

    agents: dict[str, int]
    stopped: dict[str, bool]
    workers: dict[int, str | None]
    second_group_s: float | None = None
    old_group_exited_s: float | None = None

    @property
    def confirmed(self) -> bool:
        """Every agent stopped while its workers ran on, and the spares formed a second group beside them."""
        running = bool(self.workers) and not {"T", "t", *_GONE} & set(self.workers.values())
        return bool(self.stopped) and all(self.stopped.values()) and running and self.second_group_s is not None

    def evidence(self, spares: list[str]) -> str:
        formed = self.second_group_s is not None
        return (
            f"agents {self.agents} stopped: {self.stopped}; their workers' states then {self.workers}; the spares "
            f"{spares} ran "
            + (f"workers {self.second_group_s} s later (a second group)" if formed else "no workers (no second group)")
            + f"; the old group's workers exited {self.old_group_exited_s} s after the stop, then SIGCONT"
        )


def freeze_agents(
    agents: dict[str, int],
    workers: set[int],
    hold: Path,
    second_group: Callable[[], bool],
    say: Callable[[str, str], None],
    timeout_s: float = PHASE_TIMEOUT_S,
) -> Freeze:
    """Hold the job (``hold`` exists), SIGSTOP ``agents``, wait until ``second_group()`` (every spare runs workers),
    let the job go, wait until ``workers`` (the old group's) are gone, SIGCONT the agents. ``say(what, detail)`` is
    told each phase as it happens. The hold file goes and the agents are let go whatever happens."""
    hold.touch()
    start = time.time()
    fz = Freeze(agents, {}, {})
    try:
        for pid in agents.values():
            os.kill(pid, signal.SIGSTOP)
        fz.stopped = {
            n: bool(wait_until(lambda p=pid: process_state(p) in ("T", "t"), 5, 0.02)) for n, pid in agents.items()
        }
        fz.workers = {p: process_state(p) for p in workers}
        say("agents frozen", f"SIGSTOP the agents {agents} only; their workers {fz.workers} train on")
        if wait_until(second_group, timeout_s):
            fz.second_group_s = round(time.time() - start, 1)
            say("second group", f"the spares run workers {fz.second_group_s} s after the stop: a newer round")
    finally:
        hold.unlink(missing_ok=True)
        try:
            if wait_until(lambda: all(process_state(p) in _GONE for p in workers), timeout_s):
                fz.old_group_exited_s = round(time.time() - start, 1)
        finally:
            for pid in agents.values():
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            say("agents thawed", f"SIGCONT {sorted(agents.values())}; old group exited: {fz.old_group_exited_s} s")
    return fz

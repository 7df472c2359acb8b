"""The emulator's ``kill-worker`` fault: one training worker SIGKILLed inside a node pod, the pod itself left alone.

A worker process dies (the OOM killer, a crashed CUDA context) while its container's PID 1, the torchrun agent, lives
on: the kubelet sees nothing, the Job controller nothing. What follows is the agent's business: with
``failover.in_place`` its agent starts that one worker again and every other worker, in this pod and the others,
keeps its process (docs/inprocess.md); without it the agents restart their worker groups (every worker new, no pod
replaced). :class:`WorkerKill` holds what the verdict needs to tell the two apart: every node pod's worker pids
before the kill and once the job recovered (its ``in_place`` record, or the next ``start`` of a group restart), and
when an agent said it noticed (its log line, stamped as the emulator reads it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from training.goodput.analysis import DETECT_RE
from training.job.lifecycle import worker_rank

#: The fault's kind (``kill-worker:<node index>@<step>``).
KILL_WORKER = "kill-worker"
#: The in-place agent's line for a worker it replaces (training.launch.inplace_agent).
IN_PLACE_NOTICE = "[agent] in-place: worker rank "


def _state(pid: int) -> str | None:
    """A process's state letter, None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _dead(pid: int, within_s: float = 2.0) -> bool:
    """Whether ``pid`` is gone or a zombie (its agent has not reaped it yet) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.02)
    return False


@dataclass
class WorkerKill:
    """One ``kill-worker`` fault and what was seen after it (see the module docstring).

    ``pods()`` gives the node pods running now ({completion index: pod}, each with ``worker_pids()``, ``log_path``);
    ``records()`` the job's metrics records so far."""

    entry: dict  # the emulator's fault_log entry (label, time, confirmed, evidence, ...)
    index: int  # the node pod's completion index
    pid: int
    rank: int | None
    before: dict[int, list[int]]
    after: dict[int, list[int]] | None = None
    noticed: float | None = None
    _offsets: dict[str, int] = field(default_factory=dict)

    @classmethod
    def inject(cls, pods: dict[int, Any], index: int, step: int) -> "WorkerKill | None":
        """SIGKILL the highest-rank worker of node pod ``index`` (rank 0 writes the job's records; with one worker
        per pod it is that one); None when the pod runs no worker."""
        pod = pods.get(index)
        workers = sorted(pod.worker_pids()) if pod is not None else []
        if not workers:
            return None
        before = {i: sorted(p.worker_pids()) for i, p in sorted(pods.items())}
        ranked = sorted(workers, key=lambda p: (worker_rank(p) is None, worker_rank(p) or 0))
        pid = ranked[-1]
        rank = worker_rank(pid)
        # what the agents say from now on: read before the kill, since an agent may log its notice before the wait
        # for the pid below returns (a line read as already seen would leave the kill unnoticed)
        offsets = {p.log_path: _size(p.log_path) for p in pods.values()}
        t = time.time()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        dead = _dead(pid)
        entry = {
            "label": f"{KILL_WORKER} rank {rank} in node-{index} pod",
            "time": t,
            "step": step,
            "pod": pod.name,
            "kind": KILL_WORKER,
            "rank": index,
            "job": "node",
            "faulted": [],  # no pod is faulted: the pod itself must stay
            "confirmed": dead,
            "evidence": f"worker pid {pid} (rank {rank}) of {pod.name} "
            + ("gone" if dead else "still running 2 s after SIGKILL")
            + f"; the pod's PID 1 (pid {pod.proc.pid}) {'running' if pod.proc.poll() is None else 'ended'}",
        }
        return cls(entry, index, pid, rank, before, _offsets=offsets)

    def observe(self, pods: dict[int, Any], records: Callable[[], list[dict]]) -> None:
        """One look, while the run goes on: the agents' notice in the node pods' logs, and every pod's workers once
        the job recovered (its ``in_place`` record or a new ``start`` after the kill)."""
        if self.noticed is None:
            for p in pods.values():
                for line in self._new_lines(p.log_path):
                    if self.noticed is None and (IN_PLACE_NOTICE in line or DETECT_RE.search(line)):
                        self.noticed = time.time()
        if self.after is None:
            t0 = self.entry["time"]
            if any(r.get("event") in ("in_place", "start") and r["time"] > t0 for r in records()):
                self.after = {i: sorted(p.worker_pids()) for i, p in sorted(pods.items())}

    def _new_lines(self, path: str) -> list[str]:
        """The complete lines ``path`` gained since the last look (a line being written waits for its end)."""
        start = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        complete, newline, _ = data.rpartition(b"\n")
        self._offsets[path] = start + len(complete) + len(newline)
        return complete.decode(errors="replace").split("\n") if newline else []

    def facts(self) -> dict:
        """For :func:`chaos.local.scenarios.check_survivors_kept_in_place` (``in_place_kill``)."""
        return {"pid": self.pid, "node": self.index, "before": self.before, "after": self.after or {}}


def read_records(path: Path) -> list[dict]:
    """The metrics records written so far (a line being written is skipped)."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out

"""Process lifetime: a child that dies with its parent (the Linux parent-death signal).

torchrun starts workers in their own sessions (``start_new_session=True``), and the local launcher does the
same with its agents, so a signal to the launcher's process group never reaches them. If the launcher is
SIGKILLed (or crashes) nobody forwards anything, and its children would go on training and writing
checkpoints unsupervised. ``prctl(PR_SET_PDEATHSIG)`` makes the kernel send a signal to a process the
moment its parent exits, whatever the reason:

* workers (``python -m training`` under a torchrun agent): SIGKILL, see :func:`die_with_agent`;
* a finished worker leaves without interpreter finalization, see :func:`exit_without_finalization`;
* agents started by ``python -m training.launch`` (:mod:`training.launch.agent`) and its standalone store:
  SIGTERM, so the agent stops its workers the clean way (checkpoint at the next step), see
  :func:`die_with_launcher`.

The kernel ties the signal to the parent *thread* that forked the child, not to the parent process: a child
forked from a short-lived thread is signalled when that thread exits. Every parent here forks from its main
thread (torchrun's agent starts workers from ``agent.run()`` on the main thread, the local launcher starts
agents and the store from ``main()``), which lives as long as the process.

Linux only; elsewhere these functions do nothing and return False.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: Set by a parent that wants its child to die with it: the parent's pid (read and removed by the child).
PARENT_ENV = "T5_DIE_WITH_PARENT"
#: Set by the agent wrapper for its workers: the agent's pid (see :func:`die_with_agent`).
AGENT_ENV = "T5_AGENT_PID"


def die_with_parent(sig: int, parent_pid: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits; returns False off Linux.

    ``parent_pid`` is the process that is meant to be the parent (default: the current parent). If it is
    already gone (this process was reparented before the call), ``sig`` is sent at once: the kernel would
    never send it, since the death happened before the request.
    """
    if not sys.platform.startswith("linux"):
        return False
    expected = os.getppid() if parent_pid is None else parent_pid
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG, {int(sig)}): {os.strerror(err)}")
    if os.getppid() != expected:  # the parent died before (or while) we asked
        os.kill(os.getpid(), sig)
    return True


def die_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """Die with the parent named in ``T5_DIE_WITH_PARENT`` (set by the local launcher); no-op without it.

    The variable is removed from ``os.environ`` so that this process's own children (torchrun's workers)
    do not mistake it for a request addressed to them.
    """
    raw = os.environ.pop(PARENT_ENV, "")
    if not raw:
        return False
    if not raw.isdigit():
        raise ValueError(f"{PARENT_ENV}={raw!r} must be the parent's pid; unset it or set a pid")
    return die_with_parent(sig, int(raw))


def die_with_agent() -> bool:
    """In a worker started by a torchrun agent, SIGKILL this worker when the agent exits; no-op otherwise.

    An agent that vanished without stopping its workers (SIGKILL, OOM kill, a crash) means its node is gone
    as far as the job is concerned: the other nodes restart without it, and a worker left behind would only
    block their collectives or hold the checkpoint directory. SIGKILL rather than SIGTERM: a clean stop
    needs every rank at the next step boundary, which a worker whose peers are being restarted may never
    reach. The clean stop stays available by signalling the agent (or the launcher), which forwards it.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # a plain `python -m training`: nothing to die with
        return False
    armed = die_with_parent(signal.SIGKILL)
    agent = os.environ.get(AGENT_ENV, "")
    if armed and agent.isdigit() and not process_running(int(agent)):
        # The agent died before the request above (we were already reparented, so the kernel will not
        # signal us). Its pid, not our parent's, is checked: a wrapper may sit between agent and worker.
        os.kill(os.getpid(), signal.SIGKILL)
    return armed


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3, the state, is the first), None once the
    process is gone. ``pid`` may be "self"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def process_running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


#: Process name (``/proc/PID/comm``, what ``ps`` and ``top`` show) of a worker: the prefix and its global rank.
#: A worker forked by the agent's forkserver (:mod:`training.launch.warm_workers`) has no RANK in
#: ``/proc/PID/environ``, so tools that look for workers (the chaos harnesses) go by this name.
WORKER_NAME_PREFIX = "t5f-rank-"
PR_SET_NAME = 15  # <linux/prctl.h>


def name_worker(rank: str | int | None) -> bool:
    """Name this process ``t5f-rank-<rank>`` (Linux, main thread; the kernel keeps 15 characters).
    Returns False off Linux or without a rank."""
    if rank is None or str(rank) == "" or not sys.platform.startswith("linux"):
        return False
    name = f"{WORKER_NAME_PREFIX}{rank}".encode()[:15]
    return ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0) == 0


def worker_rank(pid: int) -> int | None:
    """The global rank of worker ``pid`` from its process name, or None (not a worker, or gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return None
    rest = name[len(WORKER_NAME_PREFIX) :] if name.startswith(WORKER_NAME_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


def exit_without_finalization(code: int) -> None:
    """Exit now with ``code``, skipping interpreter finalization. Call it once everything is closed (files
    written, process groups destroyed). Finalization adds nothing then, but it runs the destructors of C++
    threads torch.distributed started, and under load one of them can abort the process ("terminate called
    without an active exception", SIGABRT): seen in about 1 of 30 finished jobs on a busy 2-core machine, and
    in a gloo probe under torchrun in CI, turning a clean exit 0 into a failure."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

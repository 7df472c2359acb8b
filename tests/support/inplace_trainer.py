"""The real trainer's ranks for the in-place recovery tests (tests/e2e/failover/test_inplace_trainer_e2e.py), and
their agent.

One process imports what the agent's forkserver preloads (torch, the trainer, T5's module) once and forks one child
per rank, as the launcher's warm workers are started (a replacement's first model build took 1.8 s without T5's
module preloaded, 0.4 s with it); before that it runs the job's start checks once, as the launcher does. Each
child runs ``python -m training``'s ``main`` with the rank's environment (one simulated node: ``LOCAL_WORLD_SIZE``
is the world). The process then
plays the ranks' agent: it reaps them; with ``--report`` a rank ended by a signal is reported gone on the job's board
(as an agent's ``waitpid`` would); nothing replaces it. Without ``failover.in_place`` the survivors' collectives
fail and they end, as workers whose agent restarts the group do.

Every start and exit goes to ``<dir>/agent.jsonl`` (``start``: rank, pid; ``exit``: rank, pid, code or signal;
each with its wall time ``t``). The agent exits 0 once every child has ended with 0 or a signal, else with the
first other code (the others SIGKILLed).

    python -m tests.support.inplace_trainer --dir D --world 3 --report -- --failover.in_place true ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--report", action="store_true", help="report a rank ended by a signal gone on the job's board")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the trainer's arguments, after --")
    a = p.parse_args()
    trainer_args = a.args[1:] if a.args[:1] == ["--"] else a.args
    import torch  # once, before the forks

    torch.set_num_threads(1)
    import importlib

    import training.__main__ as entry
    from training.launch.warm_workers import PRELOAD

    for module in PRELOAD:  # what the agent's forkserver imports before it forks a warm worker (T5's too)
        if module != "training.launch.forkserver_init":  # the forkserver's own set-up
            importlib.import_module(module)
    from training.job.failover import member_id
    from training.launch import inplace_board

    inplace_board.install()  # as this project's agent does in its workers (training.launch.worker)
    from training.job.lifecycle import die_with_parent

    from training.config import parse_args
    from training.job.check import DONE_ENV, check_job

    # once here, as the launcher does before it starts any worker (training.launch.cli): a replacement skips them
    check_job(parse_args(trainer_args)[0], nproc_per_node=a.world)
    os.environ[DONE_ENV] = "1"
    with socket.socket() as s:  # failover.in_place off: the agent's group rendezvous (env://)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(a.dir, "agent.jsonl"), "a", buffering=1)

    def note(event: str, **fields) -> None:
        log.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    def fork(rank: int) -> int:
        pid = os.fork()
        if pid == 0:  # the rank: it never returns into the agent's code
            die_with_parent(signal.SIGKILL)  # a test that kills its agent (a failure) leaves no rank behind
            os.environ.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(a.world),
                LOCAL_WORLD_SIZE=str(a.world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            code = 1
            try:
                code = entry.main(trainer_args)
            except BaseException:  # noqa: BLE001 - os._exit below would swallow it
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        note("start", rank=rank, pid=pid)
        return pid

    children = {fork(rank): rank for rank in range(a.world)}
    board = None
    if a.report:
        board = inplace_board.board_from_env()
        board.gone()  # logged in before it matters
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        if os.WIFSIGNALED(status):
            note("exit", rank=rank, pid=pid, signal=os.WTERMSIG(status))
            if board is not None:
                # what an agent's waitpid sees at once; the member id is the one the rank gave itself
                board.report_gone(member_id(rank, pid))
            continue
        code = os.WEXITSTATUS(status)
        note("exit", rank=rank, pid=pid, code=code)
        if code != 0:
            for other in children:
                os.kill(other, signal.SIGKILL)
            for _ in list(children):
                os.wait()
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The emulator's ``kill-worker`` fault (testbed.k8s_worker_kill) against a real process: the agent's notice of the
death counts whenever it is logged after the SIGKILL."""

from __future__ import annotations

import subprocess
import sys

from testbed.k8s_worker_kill import WorkerKill


def test_worker_kill_sees_an_agent_line_logged_while_the_fault_is_still_being_injected(tmp_path):
    """CI failure of stop 58: the agent logged ``failed (exitcode: -9)`` before the injector had read the pods' log
    sizes (it first waits for the killed pid to go), so the notice counted as seen before the kill and the verdict
    said "nothing noticed it". Here the pod's agent logs its line from inside ``inject``, after the SIGKILL."""
    log = tmp_path / "node-0.log"
    log.write_text("step 3/8\n")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    class Agent:  # the pod's PID 1: asked whether it still runs, it has just logged the worker's death
        pid = 4242

        def poll(self):
            with open(log, "a") as f:
                f.write(
                    f"E1129 api.py:836] failed (exitcode: -9) local_rank: 0 (pid: {worker.pid}) of fn: run_worker\n"
                )
            return None

    class Pod:
        name, log_path, proc = "job-node-0-0-a0", str(log), Agent()

        def worker_pids(self):
            return [worker.pid]

    try:
        kill = WorkerKill.inject({0: Pod()}, 0, step=3)
        assert kill is not None and kill.entry["confirmed"], kill and kill.entry
        kill.observe({0: Pod()}, lambda: [])
        assert kill.noticed is not None
    finally:
        worker.kill()
        worker.wait()

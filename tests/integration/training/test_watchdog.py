"""The heartbeat watchdog on a real TCPStore, in one process: a silent peer is declared after the timeout (and
only then); a peer that ended on purpose is not."""

import re
import time

import pytest
import torch.distributed as dist

from training.job.progress import Heartbeat
from training.job.watchdog import PeerWatchdog


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return dist.PrefixStore("test/", server)


def pair(store, timeout_s, ended):
    return [
        PeerWatchdog(
            timeout_s=timeout_s,
            rank=r,
            world=2,
            store=store,
            on_silent=lambda line, r=r: ended.append((r, "silent", line)),
            exit_fn=lambda code, r=r: ended.append((r, "exit", code)),
        )
        for r in (0, 1)
    ]


def test_a_silent_peer_is_declared_after_the_timeout_and_ends_the_watcher(store):
    ended = []
    w0, w1 = pair(store, 3, ended)
    w0.start()
    w1.start()
    time.sleep(2.5)
    assert ended == []  # both beat: nobody is silent
    w1._stop.set()  # rank 1 stops beating without saying "done" (a stopped or powered-off node)
    w1._thread.join()
    t0 = time.monotonic()
    while len(ended) < 2 and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert [(r, kind) for r, kind, _ in ended] == [(0, "silent"), (0, "exit")], ended
    line = ended[0][2]
    assert "rank 0: rank 1 (node 0" in line and "no heartbeat for" in line and "heartbeat_timeout_s 3" in line
    silent_s = float(re.search(r"no heartbeat for ([0-9.]+) s", line).group(1))
    assert silent_s >= 3  # declared only once the timeout had passed
    w0._stop.set()


def test_a_peer_that_ended_on_purpose_is_not_declared(store):
    ended = []
    w0, w1 = pair(store, 3, ended)
    w0.start()
    w1.start()
    time.sleep(1.5)
    w1.close()  # publishes "done"
    before = Heartbeat.from_json(store.get("hb/0").decode()).beat
    time.sleep(5)
    assert ended == [] and w0._thread.is_alive()  # rank 0 declared nothing...
    # ...and still beats: whoever watches it must not see silence
    assert Heartbeat.from_json(store.get("hb/0").decode()).beat >= before + 3
    w0.close()
    assert store.get("hb/0") == b"done"


def test_one_process_or_timeout_zero_watches_nothing():
    assert not PeerWatchdog(timeout_s=0, rank=0, world=2, store=object()).enabled
    assert not PeerWatchdog(timeout_s=5, rank=0, world=1, store=object()).enabled


def test_the_node_watchdog_kills_only_a_child_worker_whose_heartbeat_is_stale(tmp_path):
    import os
    import subprocess

    from training.job.watchdog import NodeWatchdog

    fresh, stale = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        wd = NodeWatchdog(str(tmp_path))
        now = time.time()
        for proc, age in ((fresh, 1), (stale, 10)):
            beat = tmp_path / str(proc.pid)
            beat.write_text("3 1 42\n")  # timeout 3 s, rank 1, beat 42
            os.utime(beat, (now - age, now - age))
        stranger = tmp_path / str(os.getppid())  # alive, but not a child of this "agent": never touched
        stranger.write_text("3 0 1\n")
        os.utime(stranger, (now - 100, now - 100))
        assert wd.check(now) == [stale.pid]
        assert stale.wait(timeout=5) == -9 and fresh.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == [str(fresh.pid)]  # the stale and the stranger forgotten
    finally:
        for p in (fresh, stale):
            p.kill()
            p.wait()


def test_the_node_watchdog_also_kills_a_stale_worker_forked_by_the_agents_forkserver(tmp_path):
    import os
    import signal
    import subprocess

    from training.job.watchdog import NodeWatchdog

    # agent (this process) -> "forkserver" (bash) -> worker (sleep): a warm worker is the agent's grandchild
    middle = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; wait $!"], stdout=subprocess.PIPE, text=True)
    worker = int(middle.stdout.readline())
    try:
        beat = tmp_path / str(worker)
        beat.write_text("3 1 42\n")
        old = time.time() - 10
        os.utime(beat, (old, old))
        assert NodeWatchdog(str(tmp_path)).check() == [worker]
        assert middle.wait(timeout=5) == 128 + signal.SIGKILL  # bash's `wait` reports its child's SIGKILL
    finally:
        middle.kill()
        middle.wait()


class _FlakyStore:
    """A store that stops answering when told to (the workers' store behind a broken connection)."""

    def __init__(self, inner):
        self.inner, self.down = inner, False

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def call(*args):
            if self.down:
                raise RuntimeError("Connection reset by peer")
            return method(*args)

        return call


def test_a_store_that_does_not_answer_pauses_the_verdicts_and_never_ends_the_worker(store, capfd):
    ended = []
    flaky = _FlakyStore(store)
    w0 = PeerWatchdog(timeout_s=2, rank=0, world=2, store=flaky, exit_fn=lambda code: ended.append(code))
    w1 = PeerWatchdog(timeout_s=2, rank=1, world=2, store=flaky, exit_fn=lambda code: ended.append(code))
    w0.start()
    w1.start()
    time.sleep(1.5)
    flaky.down = True  # the store stops answering (its host, rank 0's worker, went) for longer than the timeout
    time.sleep(4)
    assert ended == [] and w0._thread.is_alive() and w1._thread.is_alive(), ended  # before: both ended
    flaky.down = False
    time.sleep(3)
    assert ended == []  # both measure afresh once the store is back: no silence is blamed on a peer
    err = capfd.readouterr().err
    assert (
        "rank 0: the workers' store does not answer (RuntimeError: Connection reset by peer); peer verdicts "
        "paused, training goes on" in err
    )
    assert "rank 0: the workers' store answers again; peer verdicts resumed" in err
    w0.close()
    w1.close()


def test_a_wedged_main_thread_is_declared_in_one_line_and_its_heartbeat_file_carries_the_verdict(
    store, tmp_path, monkeypatch, capfd
):
    from training.job.progress import FORWARD_BACKWARD, ProgressTracker
    from training.job.watchdog import HEARTBEAT_DIR_ENV

    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
    progress = ProgressTracker(floor_s=3, multiple=4, warmup=1, startup_s=3, train_timeout_s=60)  # this thread's
    ended = []
    w = PeerWatchdog(
        timeout_s=10,
        rank=1,
        world=2,
        store=store,
        on_silent=ended.append,
        exit_fn=lambda code: ended.append(code),
        progress=progress,
    )
    w.start()
    progress.enter(FORWARD_BACKWARD, 5)
    entered = time.monotonic()
    time.sleep(1.5)
    beat = Heartbeat.from_json(store.get("hb/1").decode())
    assert (beat.step, beat.phase) == (5, FORWARD_BACKWARD) and not ended  # beats carry the progress
    time.sleep(3.5)  # this (main) thread makes no progress past the start-up bound of 3 s: wedged
    assert len(ended) == 1 and w._thread is not None and not w._thread.is_alive()  # no exit: the agent kills it
    line = ended[0]
    found = re.search(
        r"rank 1 \(node \S+, pid \d+\) is wedged: no progress in phase forward_backward of step 5 for "
        r"(\d+\.\d) s \(bound 3\.0 s",
        line,
    )
    assert found, line
    # past its bound, and no longer than it had been stuck (a loaded machine's watchdog tick may come late)
    assert 3.0 <= float(found.group(1)) <= time.monotonic() - entered + 0.05, line
    assert line in capfd.readouterr().err
    assert (tmp_path / str(__import__("os").getpid())).read_text().split()[3] == "wedged"
    stopped = store.get("hb/1")
    time.sleep(1.5)
    assert store.get("hb/1") == stopped  # no more beats: without its agent, its peer declares it silent


def test_the_node_watchdog_kills_a_worker_that_declared_itself_wedged_at_once(tmp_path, capfd):
    import subprocess

    from training.job.watchdog import NodeWatchdog

    worker = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / str(worker.pid)).write_text("10 1 42 wedged\n")  # fresh: 10 s of heartbeat timeout left
        assert NodeWatchdog(str(tmp_path)).check() == [worker.pid]
        assert worker.wait(timeout=5) == -9
        assert f"worker pid {worker.pid} (rank 1) declared itself wedged" in capfd.readouterr().err
    finally:
        worker.kill()
        worker.wait()


def test_a_workers_own_exit_code_stops_its_agent_instead_of_a_restart(tmp_path, monkeypatch):
    import signal
    import subprocess

    from training.job.watchdog import HEARTBEAT_DIR_ENV, NodeWatchdog, tell_agent_final_exit

    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
    tell_agent_final_exit(5)  # as a worker that diverged does before it exits 5
    agent = subprocess.Popen(["sleep", "60"])  # stands in for the agent process the SIGTERM goes to
    try:
        wd = NodeWatchdog(str(tmp_path))
        wd.agent = agent.pid
        assert wd.check() == [] and wd.final_exit == 5
        assert agent.wait(timeout=5) == -signal.SIGTERM
        wd.check()  # once: a second look sends nothing more
        assert wd.final_exit == 5
    finally:
        agent.kill()
        agent.wait()


def test_a_worker_with_its_own_exit_code_sigterms_its_agent_itself_once(tmp_path, monkeypatch):
    """torchrun looks at its workers every 0.1 s, the NodeWatchdog once a second: the worker must not wait for
    the watchdog, or the group is restarted first (seen in CI: a diverged run restarted from step 0)."""
    import signal
    import subprocess

    from training.job.lifecycle import AGENT_ENV
    from training.job.watchdog import HEARTBEAT_DIR_ENV, NodeWatchdog, tell_agent_final_exit

    agent = subprocess.Popen(["sleep", "60"])  # stands in for the agent process
    try:
        monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
        monkeypatch.setenv(AGENT_ENV, str(agent.pid))
        tell_agent_final_exit(5)  # rank 0 of the node
        assert agent.wait(timeout=5) == -signal.SIGTERM  # at once, from the worker
        again = subprocess.Popen(["sleep", "60"])
        try:
            monkeypatch.setenv(AGENT_ENV, str(again.pid))
            tell_agent_final_exit(5)  # another rank of the same node: the agent was told already
            wd = NodeWatchdog(str(tmp_path))
            wd.agent = again.pid
            assert wd.final_exit_code() == 5  # read when the SIGTERM arrives, not at the watchdog's next look
            wd.check()
            with pytest.raises(subprocess.TimeoutExpired):
                again.wait(timeout=1)  # no second SIGTERM, from a worker or the watchdog
        finally:
            again.kill()
            again.wait()
    finally:
        agent.kill()
        agent.wait()


def test_an_in_place_recovery_closes_the_watchdog_without_waiting_on_a_store_host_gone_silent():
    """The workers' store is rank 0's worker's: on a real network a lost rank 0's host leaves its connections open
    and silent (here: the store's process SIGSTOPped), and a call that waits for an answer blocks for the store's
    timeout or longer (here, until the store answers: the heartbeat thread's look at its peer holds the client, and
    the last write waits behind it). The recovery's close (``wait=False``) returns at once and says "done" in the
    background once the store answers; the ordinary close waits as long (what held a survivor past its agent's grace
    on the Slurm lab)."""
    import signal
    import subprocess
    import sys
    import threading
    from datetime import timedelta

    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
            "print(s.port, flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())

        def watchdog(rank: int) -> PeerWatchdog:
            client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=3))
            return PeerWatchdog(timeout_s=3, rank=rank, world=2, store=client, exit_fn=lambda code: None)

        recovering, ending = watchdog(0), watchdog(1)
        recovering.start()
        ending.start()
        time.sleep(1.5)  # beats landed
        server.send_signal(signal.SIGSTOP)
        time.sleep(1.2)  # each heartbeat thread is now in its look at its peer's counter, which waits for an answer
        t0 = time.monotonic()
        recovering.close(wait=False)
        assert time.monotonic() - t0 < 0.5
        closing = threading.Thread(target=ending.close, daemon=True)
        closing.start()
        closing.join(timeout=3.0)  # past its 2 beats' wait for the heartbeat thread: its "done" waits on the store
        assert closing.is_alive()
        server.send_signal(signal.SIGCONT)
        closing.join(timeout=10)
        assert not closing.is_alive()
        reader = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        deadline = time.monotonic() + 10
        while reader.get("hb/0") != b"done" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reader.get("hb/0") == b"done"  # said in the background once the store answered
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()

"""The progress tracker: bounds follow what was observed; a main thread stuck outside a collective is a stall,
one waiting for a peer inside torch.distributed is not; the heartbeat payload; the process-group timeout rule.

Here: the test that waits on a real TCPStore (a socket); the rest is in tests/unit/training/test_progress.py."""

import threading
import time

import torch.distributed as dist

from training.job.progress import STARTUP, ProgressTracker


def test_a_thread_waiting_for_a_peer_in_torch_distributed_is_not_wedged_a_thread_stuck_elsewhere_is():
    from torch.distributed.elastic.utils.store import barrier

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    stuck = threading.Event()

    def waits_for_a_peer():  # a 2-party barrier nobody else enters: blocked inside torch.distributed
        try:
            barrier(store, 2, key_prefix="test", barrier_timeout=20)
        except Exception:  # noqa: BLE001 - times out at the end of the test
            pass

    found, threads = {}, []
    for name, body in (("peer", waits_for_a_peer), ("own", stuck.wait)):

        def target(name=name, body=body):
            found[name] = ProgressTracker(floor_s=3, multiple=4, warmup=1, startup_s=1, train_timeout_s=60)
            body()

        threads.append(threading.Thread(target=target, daemon=True))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(found) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # both blocked by now
    assert found["peer"].waiting_for_peers()
    assert not found["own"].waiting_for_peers()
    clock_now = time.monotonic() + 2  # past the start-up bound of 1 s
    assert found["peer"].stall(clock_now) is None
    assert found["own"].stall(clock_now).phase == STARTUP
    stuck.set()
    # The peer arrives on a connection of its own: on the waiting thread's, its request would queue behind that
    # thread's blocked wait until the barrier timed out (20 s of test time).
    peer = dist.TCPStore("127.0.0.1", store.port, is_master=False)
    barrier(peer, 2, key_prefix="test", barrier_timeout=20)  # both threads end
    for th in threads:
        th.join(timeout=10)
    assert not any(th.is_alive() for th in threads)

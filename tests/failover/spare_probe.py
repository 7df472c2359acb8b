"""Probe for tests/failover/test_spare_fixes.py: three real c10d rendezvous handlers (max 2 nodes) on one TCP
store, in threads; the two participants re-form while the third stands by. Prints one JSON line: who is in
each round, what the participants' ``num_nodes_waiting()`` says, and the wait / redundancy list sizes.

    python tests/failover/spare_probe.py [fixed]     # fixed: with training.launch.spare_fixes applied
"""
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.failover.rdzv_probe import handlers  # noqa: E402


def main(fixed: bool) -> None:
    if fixed:
        from training.launch.spare_fixes import apply_spare_fixes
        apply_spare_fixes()
    _server, hs = handlers(3, min_nodes=2, max_nodes=2, last_call_timeout=1)
    joined: dict[int, int] = {}

    def join(i: int) -> None:
        hs[i].next_rendezvous()
        joined[i] = joined.get(i, 0) + 1

    seen: list[int] = []  # what running agents' num_nodes_waiting() said right after the round formed

    def settle(want: int, timeout: float = 15.0, watch: bool = False) -> None:
        end = time.monotonic() + timeout
        while sum(joined.values()) < want and time.monotonic() < end:
            time.sleep(0.01)
        end = time.monotonic() + 1.5  # let the one left over act (stand by, or sit on the wait list)
        while time.monotonic() < end:
            if watch:  # what an agent's monitor loop asks every 0.1 s once its workers started
                seen.extend(hs[i].num_nodes_waiting() for i in sorted(joined) if joined[i] == want // 2)
            time.sleep(0.05)

    for i in range(3):
        threading.Thread(target=join, args=(i,), daemon=True).start()
        time.sleep(0.3)
    settle(2)
    first = sorted(joined)
    for i in first:  # a worker failure: every running agent leaves its round and joins the next
        threading.Thread(target=join, args=(i,), daemon=True).start()
    settle(4, watch=True)
    second = sorted(i for i in range(3) if joined.get(i, 0) == (2 if i in first else 1))
    state = hs[second[0]]._state_holder.state if second else None
    print(json.dumps({"first": first, "second": second,
                      "waiting": [hs[i].num_nodes_waiting() for i in second], "max_waiting_seen": max(seen, default=None),
                      "wait_list": len(state.wait_list) if state else None,
                      "redundancy_list": len(state.redundancy_list) if state else None}), flush=True)
    os._exit(0)  # the third handler's thread is still blocked in its rendezvous


if __name__ == "__main__":
    main(len(sys.argv) > 1 and sys.argv[1] == "fixed")

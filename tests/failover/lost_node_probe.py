"""Probe for tests/failover/test_lost_nodes.py: two real c10d rendezvous handlers (nodes 1:2, keep-alive 1 s x 3)
on one TCP store, in threads, as two agents' handlers. Prints one JSON line.

1. both train in one round for 4.5 s: what the first agent's ``num_nodes_waiting()`` (its monitor loop) says;
2. the second re-joins (a restart after a worker failure): the first sees it waiting and re-joins too;
3. the second's keep-alives stop (its node died): how long until the first's ``num_nodes_waiting()`` asks for a
   restart (given up after 8 s), and which node it names as lost;
4. the first re-joins alone: how long until its new round forms (last-call timeout 3 s).

    python tests/failover/lost_node_probe.py [fixed]     # fixed: training.launch.lost_nodes applied
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
        from training.launch.lost_nodes import apply_lost_node_restart
        apply_lost_node_restart()
    _server, hs = handlers(2, min_nodes=1, max_nodes=2, last_call_timeout=3)

    def join_all() -> None:
        ts = [threading.Thread(target=h.next_rendezvous, daemon=True) for h in hs]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)

    def watch(seconds: float, until_waiting: bool = False) -> tuple[list[int], float | None]:
        """Poll the first agent's num_nodes_waiting() every 0.1 s, as its monitor loop does."""
        seen, t0 = [], time.monotonic()
        while time.monotonic() - t0 < seconds:
            seen.append(hs[0].num_nodes_waiting())
            if until_waiting and seen[-1] > 0:
                return seen, time.monotonic() - t0
            time.sleep(0.1)
        return seen, None

    def lost_names() -> list[str]:
        return [f"{node.addr}:{node.pid}:{node.local_id}" for node, _ in getattr(hs[0], "_t5f_lost", [])]

    join_all()
    steady, _ = watch(4.5)
    rejoin = threading.Thread(target=hs[1].next_rendezvous, daemon=True)
    rejoin.start()
    _, rejoin_seen_s = watch(5.0, until_waiting=True)
    lost_on_rejoin = lost_names()
    hs[0].next_rendezvous()  # the first agent restarts too; the round re-forms with both
    rejoin.join(30)
    rejoin_round = len(hs[0]._state_holder.state.participants)
    second = hs[1]._this_node
    hs[1]._stop_heartbeats()  # the second node dies: no keep-alive from now on
    _, lost_after_s = watch(8.0, until_waiting=True)
    lost = lost_names()
    t0 = time.monotonic()
    hs[0].next_rendezvous()
    reform_s = time.monotonic() - t0
    print(json.dumps({"steady_max_waiting": max(steady), "rejoin_seen_s": rejoin_seen_s, "rejoin_round": rejoin_round,
                      "reform_s": reform_s, "reform_round": len(hs[0]._state_holder.state.participants),
                      "lost_on_rejoin": lost_on_rejoin, "lost_after_s": lost_after_s, "lost": lost,
                      "second_node": f"{second.addr}:{second.pid}:{second.local_id}"}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(len(sys.argv) > 1 and sys.argv[1] == "fixed")

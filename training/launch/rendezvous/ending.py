"""The job's end in etcd: the rendezvous closed in one write, and the round's store host waiting for the others.

When the job ends every agent says it left its round's exit barrier (:func:`say_left`), the first agent there
closes the rendezvous (:func:`close_round`: hot spares still standing by then leave), and the agent that hosts
the round's store keeps it up until the others have left (:func:`wait_for_others_to_leave`).
"""

from __future__ import annotations

import time

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient
from training.launch.rendezvous.layout import put_round

#: Seconds the round's store host waits at the end for the other agents to leave torchrun's exit barrier.
EXIT_WAIT_S = 10.0


def close_round(client: EtcdClient, prefix: str) -> None:
    """Mark the rendezvous of the job under ``prefix`` closed in its round record, unless it is already; with
    when it ended, in the same write (an agent that later arrives under this id is told when its job ended)."""
    while True:
        kv = client.get(prefix + "round")
        r = rounds.Round.loads(kv.value) if kv else rounds.Round(n=0)
        if r.closed:
            return
        r.closed = True
        ended = {prefix + "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if put_round(client, prefix, kv.mod_revision if kv else 0, r, extra=ended):
            return


def say_left(client: EtcdClient, prefix: str, n: int, me: str, lease: int) -> None:
    """Say agent ``me`` left round ``n``'s exit barrier (the round's store host waits for it). Best effort, and
    on its own: a store that does not answer now must not skip the close, which waits for it."""
    try:
        client.put(prefix + f"left/{n}/{me}", "1", lease=lease)
    except Exception:  # noqa: BLE001 - the host then waits EXIT_WAIT_S at most
        pass


def wait_for_others_to_leave(client: EtcdClient, prefix: str, n: int) -> None:
    """Until every live participant of round ``n`` (read whole, once) said it left, at most EXIT_WAIT_S."""
    kv = client.get(prefix + "round")
    r = rounds.Round.loads(kv.value) if kv else None
    if r is None or r.n != n:
        return
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        live = {kv.key.rsplit("/", 1)[1] for kv in client.get_prefix(prefix + "members/")[0]}
        left = {kv.key.rsplit("/", 1)[1] for kv in client.get_prefix(prefix + f"left/{r.n}/")[0]}
        if all(p not in live or p in left for p in r.participants):
            return
        time.sleep(0.2)

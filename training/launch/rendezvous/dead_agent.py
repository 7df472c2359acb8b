"""A node whose agent is dead is taken out of the job at once, not after its membership lease's TTL.

A lost node is noticed by its lease (TTL 2 s by default), and in a ``failover.in_place`` job that wait is most of
what the survivors lose (docs/inprocess.md, "A lost node"): their own collectives failed within milliseconds of the
kill. What they cannot tell from a failed collective is whether the peer's *node* is gone or only its worker (which
its agent replaces in place). Every agent serves a ``TCPStore`` from the moment it joins (its member key's
``store``, :mod:`.round_store`), so a peer can ask the node's operating system: a connection to that port that is
**refused** means no process listens there any more, the agent is dead (SIGKILLed, crashed, its pod or container
gone). Then its lease is revoked, its member key goes with it, and the closer re-forms the round with a hot spare at
once (:func:`.rounds.reformed`), exactly as it would when the lease expired.

Only a refusal counts. A connection that is accepted (a live agent, or a stopped one: the kernel still accepts into
the backlog of a SIGSTOPped process) or that times out (a host that vanished, a cut network) proves nothing, and the
lease's TTL decides as before. So a busy agent is never taken out by this, and an instance that lost its power is
still noticed by its lease. A firewall that rejects with a TCP reset looks like a dead agent: a node cut off that
way is taken out as lost, which its lease's expiry does too when the cut reaches the store.

Asked only on suspicion, by a survivor's in-place agent while a recovery is under way (a peer checked in to the next
epoch and a member on that node has not, nor was it reported gone: :mod:`training.launch.inplace_agent`), once per
node and epoch: no probe runs while the job trains.
"""

from __future__ import annotations

import json
import socket

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient

#: How long a probe waits for a connection: a refusal comes back in a round trip; a timeout proves nothing.
PROBE_TIMEOUT_S = 0.25


def refuses_connections(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``host:port`` actively refuses a TCP connection (nothing listens: the process that did is dead)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


def member_at(client: EtcdClient, prefix: str, n: int, node_rank: int) -> str:
    """The agent at ``node_rank`` of formed round ``n`` (the round record under the job's ``prefix``; the head
    every agent watches carries no member lists); "" when that round is no longer the newest or has no such rank."""
    kv = client.get(prefix + "round")
    r = rounds.Round.loads(kv.value) if kv is not None else None
    if r is None or r.n != n or not r.formed or not 0 <= node_rank < len(r.participants):
        return ""
    return r.participants[node_rank]


def take_out_if_dead(client: EtcdClient, prefix: str, member: str) -> str:
    """Revoke the membership lease of agent ``member`` (its key under the job's ``prefix``) when its store server
    refuses connections; "" when nothing was done (it is alive, unreachable, or gone already), else the address
    that refused."""
    kv = client.get(prefix + f"members/{member}") if member else None
    if kv is None or not kv.lease:
        return ""
    store = json.loads(kv.value or "{}").get("store", "")
    if not store or not refuses_connections(store):
        return ""
    client.revoke(kv.lease)
    return store

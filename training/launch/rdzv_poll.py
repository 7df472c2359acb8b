"""A rendezvous state poll that scales with the job, instead of torch's fixed 1 s.

While an agent waits for the other nodes of a c10d rendezvous round, torch 2.13 re-reads the shared state once
a second: it sleeps 1 s between reads (``_delay(seconds=1)`` in ``_DistributedRendezvousOpExecutor.run``) and
its state holder serves a cached copy for 1 s (``_BackendRendezvousStateHolder(cache_duration=1)``). After a
failure every agent re-joins within ~0.1 s, but the first one in sees the round complete only at its next
read: measured with two real c10d handlers on one store, every re-formed round took 1.0 s; with both set to
0.1 s, 0.1-0.2 s. The poll is there to bound the load on the store (each poll reads, and may write, the
whole state), so this keeps a bound rather than dropping it: :func:`poll_s` allows about
:data:`STATE_READS_PER_S` reads per second across the job (0.1 s up to 20 nodes, 0.64 s at 128, torch's 1 s from
200 nodes).

    apply_rdzv_poll(max_nodes)   # in the agent, before the rendezvous (training.launch.agent)
"""

from __future__ import annotations

#: The store load the poll is sized for: state reads per second by all waiting agents together.
STATE_READS_PER_S = 200
_FLOOR_S, _TORCH_S = 0.1, 1.0
_APPLIED = "_t5f_poll_s"


def poll_s(max_nodes: int) -> float:
    """Seconds between state reads of one waiting agent in a job of ``max_nodes`` agents."""
    return min(_TORCH_S, max(_FLOOR_S, max_nodes / STATE_READS_PER_S))


def apply_rdzv_poll(max_nodes: int) -> float:
    """Make torch's rendezvous sleep and state cache :func:`poll_s` seconds instead of 1 (other delays
    unchanged); returns it. Applies to handlers created afterwards."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    poll = poll_s(max_nodes)
    delay = getattr(dr._delay, "__wrapped__", dr._delay)
    holder = dr._BackendRendezvousStateHolder
    init = getattr(holder.__init__, "__wrapped__", holder.__init__)

    def scaled_delay(seconds):
        return delay(poll if seconds == _TORCH_S else seconds)

    def init_with_poll(self, backend, settings, cache_duration=1):
        init(self, backend, settings, cache_duration=poll if cache_duration == 1 else cache_duration)

    scaled_delay.__wrapped__, init_with_poll.__wrapped__ = delay, init
    for fn in (scaled_delay, init_with_poll):
        setattr(fn, _APPLIED, poll)
    dr._delay = scaled_delay
    holder.__init__ = init_with_poll
    return poll

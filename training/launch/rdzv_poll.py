"""A rendezvous state poll that scales with the job, instead of torch's fixed 1 s.

While an agent waits for the other nodes of a c10d rendezvous round, torch 2.13 re-reads the shared state once
a second (``_delay(seconds=1)`` in ``_DistributedRendezvousOpExecutor.run``). After a failure every agent
re-joins within ~0.1 s, but the first one in sees the round complete only at its next poll: up to 1 s of every
restart, for nothing. The poll is there to bound the load on the store (each poll reads, and may write, the
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
    """Make torch's rendezvous poll every :func:`poll_s` seconds (other delays unchanged); returns it."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    poll = poll_s(max_nodes)
    delay = getattr(dr._delay, "__wrapped__", dr._delay)

    def scaled_delay(seconds):
        return delay(poll if seconds == _TORCH_S else seconds)

    scaled_delay.__wrapped__ = delay
    setattr(scaled_delay, _APPLIED, poll)
    dr._delay = scaled_delay
    return poll

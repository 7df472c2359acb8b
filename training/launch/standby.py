"""Join as a standby: wait until the job's rendezvous round has formed with every training node, then return.

Run before the launcher on a node that should start as the hot spare rather than as a trainer. torch's c10d
rendezvous gives the round's places to the first agents to join and puts later ones on its redundancy list
(the spares); it does not let a node ask to be a spare. An agent that joins only after the round is complete
and full lands on that list, which is the whole trick.

Why the Slurm batch script uses it: the batch script runs on the allocation's first node, and losing that node
ends the allocation whatever the training does. With a spare in the allocation, making the batch host the
spare keeps the single point of failure out of training: a training node's loss (rank 0's included, now that
the store runs on the head node) is absorbed by the spare inside the allocation, and the batch host trains
only after it has taken a lost node's place.

    python -m training.launch.standby --from-env slurm [--nodes N] [--rdzv-endpoint HOST:PORT] [--timeout 300]

Exits 0 once the round is complete with the training nodes, or when ``--timeout`` passes (then the node joins
anyway, as a late agent would, and says so); 2 for a bad setting. Reads the round state the agents keep in the
store (``torch.rendezvous.<run id>``, torch's c10d backend), the same state torch itself reads.
"""
from __future__ import annotations

import argparse
import datetime
import pickle
import sys
import time
from dataclasses import dataclass

from training.launch.config import LaunchError
from training.launch.from_env import config_from_env


@dataclass(frozen=True)
class Round:
    """What a standby needs to know of the rendezvous round."""

    number: int
    complete: bool
    participants: int


def _round_of(backend) -> Round | None:
    """The current round held by a torch ``C10dRendezvousBackend``, or None before any agent joined."""
    got = backend.get_state()
    if got is None:
        return None
    # The state is torch's own pickled _RendezvousState: the agents of this job unpickle it the same way.
    state = pickle.loads(got[0])  # noqa: S301 - torch's rendezvous format; see docs/failover.md, store security
    return Round(number=state.round, complete=bool(state.complete), participants=len(state.participants))


def read_round(store, run_id: str) -> Round | None:
    """The current round of rendezvous ``run_id`` in ``store`` (a torch Store), or None before any agent joined."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    return _round_of(C10dRendezvousBackend(store, run_id))


def wait_for_full_round(endpoint: str, run_id: str, nodes: int, timeout_s: float, poll_s: float = 0.2,
                        say=print) -> bool:
    """Block until round of ``run_id`` at ``endpoint`` is complete with ``nodes`` participants.

    True when it is, False when ``timeout_s`` passed first (the store unreachable included)."""
    import torch.distributed as dist

    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"rendezvous endpoint {endpoint!r} is not HOST:PORT")
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    deadline = time.monotonic() + timeout_s
    backend = None  # one per connection: constructing it writes the key's initial value to the store
    while True:
        err = None
        try:
            if backend is None:
                store = dist.TCPStore(host, int(port), is_master=False,
                                      timeout=datetime.timedelta(seconds=max(1.0, min(10.0, timeout_s))))
                backend = C10dRendezvousBackend(store, run_id)
            r = _round_of(backend)
            if r is not None and r.complete and r.participants >= nodes:
                say(f"[standby] round {r.number} of {run_id} formed with {r.participants} node(s): joining as a "
                    f"spare")
                return True
        except (RuntimeError, TimeoutError) as e:  # store not up yet, or a transient error: reconnect
            backend, err = None, e
        if time.monotonic() >= deadline:
            why = f" (last error: {err})" if err else ""
            say(f"[standby] no complete {nodes}-node round of {run_id} at {endpoint} after {timeout_s:.0f} s"
                f"{why}: joining now")
            return False
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.launch.standby", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--from-env", required=True, choices=["slurm", "pet"],
                   help="read the job (run id, training nodes, store) from this platform's environment")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of the standalone store (default: from the environment)")
    p.add_argument("--nodes", type=int, help="training nodes of the round (default: from the environment, which "
                   "counts spares as training nodes unless T5_SPARES is set)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait before joining anyway (300)")
    a = p.parse_args(argv)
    if a.nodes is not None and a.nodes < 1:
        print(f"error: --nodes {a.nodes}: use the number of training nodes (>= 1)", file=sys.stderr)
        return 2
    if a.timeout <= 0:
        print(f"error: --timeout {a.timeout}: use a positive number of seconds", file=sys.stderr)
        return 2
    try:
        cfg = config_from_env(a.from_env)
        endpoint = a.rdzv_endpoint or cfg.rdzv_endpoint
        wait_for_full_round(endpoint, cfg.rdzv_id, a.nodes or cfg.max_nodes, a.timeout,
                            say=lambda m: print(m, file=sys.stderr, flush=True))
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

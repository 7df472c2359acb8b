"""Two fixes to torch 2.13's elastic agent that hot spares (``--spares``) need, applied in each agent process.

torch keeps agents beyond MAX nodes on the rendezvous's *redundancy list* and lets one into the next round
when a node is lost. Two paths around that list are broken in 2.13:

* **A spare left on the wait list makes the job restart forever.** When every agent re-forms after a worker
  failure (all leave the round, all join the next), the spare joins too; whichever agent is left over once the
  round is full stays on the *wait* list, which only takes nodes for a round with room. The running agents see
  ``num_nodes_waiting() > 0`` and restart the worker group to admit it, the next round is full again, and so on
  (seen in the soak: restarts every second until ``--max-restarts`` ran out). Fix: an agent on the wait list of
  a full, complete round moves itself to the redundancy list (a spare again) instead of waiting there; and a
  running agent does not count a waiting agent while its own round is already full (``num_nodes_waiting`` is
  0 then): the waiter could not be admitted anyway, and it sits on the wait list for up to torch's 1 s state
  poll before it moves, long enough for agents whose warm workers started in 0.3 s to see it and restart (seen
  in the soak after warm workers: a restart every ~2 s for ~30 s after a hang).
* **An unneeded spare crashes at the end.** When the job finishes and closes the rendezvous, a spare gets
  ``RendezvousGracefulExitError``; ``SimpleElasticAgent.run`` logs it and returns None, and ``launch_agent``
  then fails on ``None.is_failed()``. Fix: that None is a success, with one line saying why.
"""

from __future__ import annotations

import sys

_APPLIED = "_t5f_spare_fix"


def apply_spare_fixes() -> None:
    """Patch torch's rendezvous join and agent run for spares (idempotent)."""
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    if getattr(dr._RendezvousJoinOp.__call__, _APPLIED, False):
        return
    join = dr._RendezvousJoinOp.__call__

    def join_or_stand_by(self, ctx, deadline):
        state = ctx.state
        if (state.complete and not state.closed and ctx.node in state.wait_list
                and ctx.node not in state.participants and len(state.participants) >= ctx.settings.max_nodes):
            return dr._Action.REMOVE_FROM_WAIT_LIST  # next pass: ADD_TO_REDUNDANCY_LIST (a round with no room)
        return join(self, ctx, deadline)

    run = api.SimpleElasticAgent.run

    def run_or_spare_done(self, role: str = api.DEFAULT_ROLE):
        result = run(self, role)
        if result is None:
            print("[agent] hot spare: the job finished without needing this node", file=sys.stderr, flush=True)
            return api.RunResult(state=api.WorkerState.SUCCEEDED)
        return result

    waiting = dr.DynamicRendezvousHandler.num_nodes_waiting

    def waiting_with_room(self) -> int:
        n = waiting(self)  # syncs the state
        state = self._state_holder.state
        if n and state.complete and len(state.participants) >= self._settings.max_nodes:
            return 0  # a full round cannot admit it: restarting would re-form at the same size
        return n

    for fn in (join_or_stand_by, run_or_spare_done, waiting_with_room):
        setattr(fn, _APPLIED, True)
    dr._RendezvousJoinOp.__call__ = join_or_stand_by
    api.SimpleElasticAgent.run = run_or_spare_done
    dr.DynamicRendezvousHandler.num_nodes_waiting = waiting_with_room

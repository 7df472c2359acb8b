"""A training pod lost while hot-spare pods wait, in a ``failover.in_place`` TrainJob: what the in-place verdict needs.

The Job controller replaces the lost pod alone (per-index retry); with a hot spare waiting, the rendezvous forms the
next round at once around the survivors' running workers, the spare pod's workers join their epoch in the lost ranks
(docs/inprocess.md, "A lost node"), and the lost pod's replacement waits as the next spare. :class:`PodLoss` holds
every node pod's worker pids just before the kill and once the job recovered (its ``in_place`` record, or the next
``start`` of a full restart), the pods that waited as spares, and whether the lost pod ran rank 0 (its agent served
the round's store: ``first-node-kill-in-place``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from training.job.lifecycle import worker_rank


@dataclass
class PodLoss:
    """One node pod's loss (see the module docstring). ``pods`` arguments: the node pods running now
    ({completion index: pod}, each with ``worker_pids()``); ``records()``: the job's metrics records so far."""

    index: int  # the lost pod's completion index
    time: float  # when the fault was injected
    pids: list[int]  # its workers at the kill
    spares: list[int]  # the node pods that ran no worker then (hot spares)
    before: dict[int, list[int]]
    rank0: bool  # it ran worker rank 0
    after: dict[int, list[int]] | None = None

    @classmethod
    def before_kill(cls, pods: dict[int, Any], index: int, t: float) -> "PodLoss":
        before = {i: sorted(p.worker_pids()) for i, p in sorted(pods.items())}
        pids = before.get(index, [])
        spares = [i for i, ps in before.items() if not ps and i != index]
        return cls(index, t, pids, spares, before, any(worker_rank(p) == 0 for p in pids))

    def observe(self, pods: dict[int, Any], records: Callable[[], list[dict]]) -> None:
        """One look while the run goes on: every pod's workers once the job recovered after the kill."""
        if self.after is None and any(
            r.get("event") in ("in_place", "start") and r["time"] > self.time for r in records()
        ):
            self.after = {i: sorted(p.worker_pids()) for i, p in sorted(pods.items())}

    @property
    def in_place_scenario(self) -> str:
        return "first-node-kill-in-place" if self.rank0 else "node-kill-in-place"

    def facts(self) -> dict:
        """For :func:`chaos.local.scenarios.check_survivors_kept_after_node_loss` (``in_place_kill``): the new workers
        must run in a pod that waited (a spare, or the lost pod's replacement if it won the join)."""
        return {
            "pids": self.pids,
            "node": self.index,
            "new_nodes": sorted({*self.spares, self.index}),
            "before": self.before,
            "after": self.after or {},
        }

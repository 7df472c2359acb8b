"""Which in-memory snapshot a restart restores, and where each shard comes from: pure functions of what the ranks
found on their nodes (no files, no collectives), so every case is a unit test in milliseconds.

    search = search_snapshots(gathered, world=2)           # gathered: every rank's (node, inventory, damaged)
    if search.chosen is None or search.chosen[0] <= storage_step: ...   # storage (or a fresh start)
    sources = same_world_sources(search.holders, world=2, step=search.chosen[0])   # shard -> (holder rank, kind)

:class:`training.checkpoint.memory.MemoryTier` gathers the inventories (one ``all_gather_object``), asks these, and
does the copying; every rank computes the same answer from the same gathered list, which is what keeps the
transfers that follow in step.

Terms: an **entry** ``(saved rank, saved world, step, kind)`` is one intact snapshot generation on a node, ``kind``
``own`` (the rank's own copy) or ``peer`` (the replica a neighbour keeps); a **shard** is a saved rank's part of the
state; a **holder** is a rank of this world whose node has that shard's entry. The rule:

* damaged generations (found by the rank that checked them, CRC32C) count as absent, on the node that has them;
* a step is complete at a saved world ``w`` when each of its ``w`` shards has a holder;
* the newest complete step wins; at the same step, the one taken at this world size (no re-cut);
* it is used only when newer than the newest complete storage checkpoint, or the same step when some rank holds that
  step live (an in-place recovery's survivors: their state stays, the lost ranks' shards come from the replicas);
* each shard is read by its own rank where that rank's node has it (no transfer), else sent by its first holder.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Entry = tuple[int, int, int, str]
"""(saved rank, saved world, step, kind): one intact snapshot generation found on a node."""
Holders = dict[tuple[int, int, int], list[tuple[int, str]]]
"""(saved world, step, shard) -> the ranks whose node has it, with the kind of copy, in rank order."""


@dataclass(frozen=True)
class SnapshotSearch:
    """What the ranks' inventories allow (see the module doc).

    Attributes:
        usable: per rank of this world, the entries its node has, less the damaged ones.
        skipped: the damaged generations every rank named (dicts with rank, world, step, copy).
        holders: who holds each shard of each (world, step).
        chosen: (step, saved world) of the newest complete snapshot, or None.
    """

    usable: list[list[Entry]]
    skipped: list[dict]
    holders: Holders
    chosen: tuple[int, int] | None = None
    worlds: list[int] = field(default_factory=list)
    """The saved world sizes any usable snapshot has (for the line that says why none was chosen)."""


def search_snapshots(gathered: list[tuple[str, list[Entry], list[dict]]], *, world: int) -> SnapshotSearch:
    """The newest snapshot complete for every shard, from every rank's ``(node, inventory, damaged)``.

    The ranks of one node list the same files, and one of them checked each generation: a damaged one named by
    any rank of a node is absent for every rank of that node (matched by node, shard, world, step and kind)."""
    skipped = [d for _, _, damaged in gathered for d in damaged]
    bad = {(node, d["rank"], d["world"], d["step"], d["copy"]) for node, _, damaged in gathered for d in damaged}
    usable = [[e for e in inventory if (node, *e) not in bad] for node, inventory, _ in gathered]
    holders: Holders = {}
    for holder, entries in enumerate(usable):
        for shard, saved_world, step, kind in entries:
            holders.setdefault((saved_world, step, shard), []).append((holder, kind))
    complete = {(step, w) for w, step, _ in holders if all((w, step, s) in holders for s in range(w))}
    # newest step first; at equal steps the one needing no re-cut
    chosen = max(complete, key=lambda sw: (sw[0], sw[1] == world), default=None)
    return SnapshotSearch(
        usable=usable, skipped=skipped, holders=holders, chosen=chosen, worlds=sorted({w for w, _, _ in holders})
    )


def same_world_sources(holders: Holders, *, world: int, step: int) -> dict[int, tuple[int, str]]:
    """Shard -> (holder rank, kind) for a snapshot of this world size: the shard's own rank when its node has it
    (no transfer), else its first holder (a peer's replica, or a node's copy sent over)."""
    return {
        s: next((hk for hk in holders[(world, step, s)] if hk[0] == s), holders[(world, step, s)][0])
        for s in range(world)
    }


def restores_from_memory(search: SnapshotSearch, *, storage_step: int, live_step: int | None = None) -> bool:
    """Whether the snapshot found is what a restart loads: not when storage holds a newer step, nor the same step
    unless ``live_step`` (the step some rank's state objects already hold: an in-place recovery's survivors) is that
    step, where storage would make every survivor read back what it holds (a ``checkpoint.load_step`` never asks: the
    checkpoint manager goes to storage then)."""
    if search.chosen is None:
        return False
    step = search.chosen[0]
    return step > storage_step or step == storage_step == live_step

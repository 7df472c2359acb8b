"""Where one rank's storage tier works: the directory, the rank and world, and the checkpoint group.

Shared by the writer and the reader (:mod:`~training.checkpoint.storage_writer`,
:mod:`~training.checkpoint.storage_reader`), so both always see the same directory (a test may point a live tier
at another one) and agree on a finding the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from training.config import CheckpointConfig


@dataclass
class StorageSite:
    """One rank's view of checkpoint.dir; the collective helpers are called by every rank at the same point."""

    cfg: CheckpointConfig
    root: Path
    rank: int
    world_size: int
    group: Any
    """The checkpoint collectives' own gloo group: async saves run them on a background thread without racing the
    training group, and a slow writer is not cut off by the short training timeout."""

    def agree(self, finding: Any) -> Any:
        """Rank 0's finding, on every rank."""
        payload = [finding]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        return payload[0]

    def first_of_all(self, finding: Any) -> Any:
        """The first rank's non-empty finding (every rank passes its own), on every rank; None if none had one."""
        found: list[Any] = [None] * self.world_size
        dist.all_gather_object(found, finding, group=self.group)
        return next((x for x in found if x), None)

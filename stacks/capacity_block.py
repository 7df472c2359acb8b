"""A Capacity Block's node count over time (pure: the EKS GPU node group and its tests use it)."""

from __future__ import annotations

import datetime
from typing import Optional

from stacks.config import CAPACITY_BLOCK_DRAIN


def capacity_block_sizes(
    node_count: int, window: Optional[tuple[datetime.datetime, datetime.datetime]], now: datetime.datetime
) -> tuple[int, list[tuple[str, datetime.datetime, int]]]:
    """A Capacity Block node group's desired size at deploy time, and the scalings still to come as (name, when,
    desired size): ``node_count`` from the block's start, 0 from :data:`CAPACITY_BLOCK_DRAIN` before its end. Before
    the start EC2 cannot launch the nodes (a fixed size would fail the deploy); after the drain point they would
    only be reclaimed. Without a window: 0 and none (the operator scales by hand; ``make deploy`` asks for it)."""
    if window is None:
        return 0, []
    start, end = window
    drain = end - CAPACITY_BLOCK_DRAIN
    desired = node_count if start <= now < drain else 0
    steps = [("ScaleUpAtBlockStart", start, node_count), ("ScaleToZeroBeforeBlockEnd", drain, 0)]
    return desired, [(name, when, size) for name, when, size in steps if when > now]

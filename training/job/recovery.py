"""One line after an automatic restart: what happened and what it cost.

When torchrun restarts the worker group (``TORCHELASTIC_RESTART_COUNT`` > 0: a worker died, was killed for its
silence or its wedge), rank 0 of the new attempt says, after its first step::

    [recovery] worker group restarted (restart 1 of 3): the previous attempt reached step 7; state restored from
    memory at step 7 (0 steps to recompute); 6.2 s from its last step to this attempt's first

The previous attempt's last step comes from the metrics file (rank 0 appends every attempt's steps to it, so it
is read before this attempt writes its own ``start`` event); only its tail is read.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

_TAIL_BYTES = 256 * 1024  # a few hundred step records: more than one attempt's last step ever needs


class RecoveryNote:
    """Says the line above once, after this attempt's first step; does nothing in a first attempt or off rank 0.

    note = RecoveryNote.build(cfg.metrics.path, rank=rank, restart_count=n, resumed_from=step,
                              restored_from=ckpt.restored_from, say=metrics.info)
    ... note.after_step(step)   # every step
    """

    def __init__(self, line: Callable[[int, float], str] | None = None, say: Callable[[str], None] = print):
        self._line, self.say = line, say

    @classmethod
    def build(
        cls,
        metrics_path: str,
        *,
        rank: int,
        restart_count: int,
        resumed_from: int | None,
        restored_from: dict | None,
        say: Callable[[str], None],
    ) -> "RecoveryNote":
        if rank != 0 or restart_count < 1:
            return cls()
        last = previous_last_step(metrics_path)
        if last is None:
            return cls()
        last_step, last_time = last
        start = resumed_from or 0
        tier = (restored_from or {}).get("tier", "a fresh start")
        tier = {"memory": "memory", "peer": "memory (peers' replicas)", "storage": "a storage checkpoint"}.get(
            tier, tier
        )
        limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        redo = max(0, last_step - start)

        def line(step: int, now: float) -> str:
            return (
                f"[recovery] worker group restarted (restart {restart_count} of {limit}): the previous attempt "
                f"reached step {last_step}; state restored from {tier} at step {start} ({redo} step(s) "
                f"recomputed); {now - last_time:.1f} s from its last step to this attempt's step {step}"
            )

        return cls(line, say)

    def after_step(self, step: int) -> None:
        if self._line is not None:
            self.say(self._line(step, time.time()))
            self._line = None


def previous_last_step(metrics_path: str) -> tuple[int, float] | None:
    """(step, time) of the newest ``step`` record in the metrics file, None when there is none."""
    try:
        with open(metrics_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            r = json.loads(raw)
        except ValueError:  # the first, cut line of the tail
            continue
        if r.get("event") == "step":
            return int(r["step"]), float(r["time"])
    return None

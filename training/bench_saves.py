"""Storage saves against the step, for ``make bench``: how much slower a step runs while an async save is written in
the background (median of the steps begun while a write was in flight vs the steps with none, before and after, so
a drift of the machine cancels out), and what the first save blocks against the later ones, for the run's
checkpoint.writer (``--checkpoint.writer thread`` after ``--`` measures the other).

    figures = measure(trainer, timed_step, step, steps=5, saves=2, first_blocked=..., later_blocked=[...])
    line = report_line(result_row)     # one line for the report, None for rows without these figures
"""

from __future__ import annotations

import statistics
from typing import Callable

#: At most this many steps are timed per write (a write outlasting them is waited for).
MAX_STEPS_PER_WRITE = 20


def measure(
    trainer,
    timed_step: Callable[[], tuple[float, int]],
    step: int,
    *,
    steps: int,
    saves: int,
    first_blocked: float,
    later_blocked: list[float],
) -> dict:
    """Save asynchronously `saves` times after `step` and time the steps that run while each write is in flight."""
    storage = trainer.ckpt.storage
    normal = [timed_step()[0] for _ in range(steps)]
    during: list[float] = []
    for k in range(saves):
        storage.save(step + 1 + k, trainer.state, force=True)
        for _ in range(MAX_STEPS_PER_WRITE):  # the steps begun while the write is in flight (the first always is)
            if not storage.writer.in_flight:
                break
            during.append(timed_step()[0])
        storage.wait()
        storage.raise_failure()
    normal += [timed_step()[0] for _ in range(steps)]
    normal_s = statistics.median(normal)
    during_s = statistics.median(during) if during else float("nan")
    return {
        "saves_writer": storage.cfg.writer,
        "saves_step_s_normal": normal_s,
        "saves_step_s_during_write": during_s,
        "saves_steps_during_write": len(during),
        "saves_during_over_normal": during_s / normal_s,
        "saves_first_blocked_s": first_blocked,
        "saves_later_blocked_s": statistics.median(later_blocked) if later_blocked else float("nan"),
    }


def report_line(r: dict) -> str | None:
    """'t5-60m: storage writer=process: a step takes 4.71 s during a background write vs 4.60 s without (1.02x,
    median of 4 steps begun during writes); a save blocks 0.210 s the first time, 0.031 s later'."""
    if "saves_writer" not in r:
        return None
    return (
        f"{r['preset']}: storage writer={r['saves_writer']}: a step takes {r['saves_step_s_during_write']:.3f} s "
        f"during a background write vs {r['saves_step_s_normal']:.3f} s without "
        f"({r['saves_during_over_normal']:.2f}x, median of {r['saves_steps_during_write']} steps begun during writes); "
        f"a save blocks {r['saves_first_blocked_s']:.3f} s the first time, {r['saves_later_blocked_s']:.3f} s later"
    )

"""Which complete checkpoints were written by a replaced worker group (pure: given facts in, verdicts out).

Each round of the job's etcd rendezvous records the step its worker group restored from (:mod:`.fence`). A
checkpoint of generation ``g`` and step ``s`` is *stale* when a later generation ``g' > g`` restored from a step
below ``s``: when that group started, step ``s`` did not exist yet, so it was written afterwards by generation
``g``, whose group had been replaced (a split brain: its agent cut off from etcd while the commit fence could not
reach the store either, so the commit went through unconfirmed). The newest-checkpoint choice skips stale ones
(the manager moves them aside, naming why); a checkpoint without a generation (a ``c10d`` or local run) is never
stale.
"""

from __future__ import annotations


def stale_checkpoints(checkpoints: dict[int, int | None], restored: dict[int, int]) -> dict[int, str]:
    """The stale ones of ``checkpoints`` (step -> the generation that committed it, None: unknown), with why, by
    step; ``restored``: generation -> the step its group restored from (0: a fresh start)."""
    out = {}
    for step, gen in checkpoints.items():
        if gen is None:
            continue
        later = sorted((g, s) for g, s in restored.items() if g > gen and s < step)
        if later:
            g, s = later[0]
            out[step] = (
                f"written by round {gen} after round {g} had replaced it (round {g} restored from step {s}, "
                f"before step {step} existed)"
            )
    return out

"""The storage tier's decisions, as pure functions of listed facts (no file system, no torch, no process group).

The writer (:mod:`~training.checkpoint.storage_writer`) and the reader (:mod:`~training.checkpoint.storage_reader`)
gather the facts (a directory scan, a marker, the timed saves) and act on what these return; the unit tests give
the facts directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

#: Once a save has been timed, checkpoint collectives wait this many times the slowest save so far (see
#: checkpoint.min_timeout_s): room for a slow file-system moment, yet a silent peer costs about a save, not an hour.
SAVE_TIMEOUT_FACTOR = 4


def collective_bound(slowest_save_s: float, min_timeout_s: float, timeout_s: float) -> float | None:
    """How long checkpoint collectives wait for a peer: SAVE_TIMEOUT_FACTOR x the slowest save, at least
    min_timeout_s, at most timeout_s; None while no save has been timed (timeout_s stays)."""
    if not slowest_save_s:
        return None
    return min(timeout_s, max(min_timeout_s, SAVE_TIMEOUT_FACTOR * slowest_save_s))


def prune_victims(good: list[int], unfinished: list[int], keep_last: int) -> list[int]:
    """Steps to delete after a commit: complete ones beyond the newest `keep_last`, and unfinished saves, but only
    those older than the oldest kept complete one (a newer unfinished save may be in flight).

    `good`: complete steps, newest first; `unfinished`: our step directories with no commit marker."""
    if len(good) <= keep_last:
        return []
    oldest_kept = good[keep_last - 1]
    return [s for s in good[keep_last:] + unfinished if s < oldest_kept]


@dataclass(frozen=True)
class Unloadable:
    """A step directory that did not verify: its step, whether it was committed once, and why it failed."""

    step: int
    committed: bool
    why: str


@dataclass(frozen=True)
class Triage:
    """What discovery does with the unloadable directories newer than the newest complete checkpoint."""

    quarantine: list[Unloadable] = field(default_factory=list)
    """Committed once, damaged now: moved aside (kept for inspection) so no later start meets them again."""
    skip: list[Unloadable] = field(default_factory=list)
    """Never committed (a save cut short): skipped with a warning, left for the next save's pruning."""


def triage(bad: Iterable[Unloadable], newest_good: int | None) -> Triage:
    """Sort the unloadable directories newer than `newest_good` (None: no complete checkpoint) into quarantine and
    skip; older ones are no candidate anyway and are left as they are."""
    out = Triage()
    for b in bad:
        if newest_good is None or b.step > newest_good:
            (out.quarantine if b.committed else out.skip).append(b)
    return out


@dataclass(frozen=True)
class Rollback:
    """What checkpoint.load_step asks of the directory."""

    applied_before: bool = False
    """This load_step was already applied by an earlier start: resume from the newest again."""
    missing: bool = False
    """No complete checkpoint of that step: refuse to start."""
    supersede: list[int] = field(default_factory=list)
    """Complete steps newer than the requested one, moved to superseded/ (kept, not loaded)."""


def rollback(load_step: int, applied: Any, good: list[int]) -> Rollback | None:
    """The decision for checkpoint.load_step (0: none) given the load_step an earlier start applied (`applied`, from
    the rollback marker, None without one) and the complete steps `good`."""
    if not load_step:
        return None
    if applied == load_step:
        return Rollback(applied_before=True)
    if load_step not in good:
        return Rollback(missing=True)
    return Rollback(supersede=[s for s in good if s > load_step])


def stored_entries(state_keys: Iterable[str], stored_keys: Iterable[str]) -> set[str]:
    """The entries of a state dict that a checkpoint holds: a key saved itself or with nested keys ('train.x').

    Entries absent from the checkpoint (the per-rank RNG of ranks that did not exist) are not loaded."""
    stored = list(stored_keys)
    return {k for k in state_keys if any(s == k or s.startswith(k + ".") for s in stored)}


@dataclass(frozen=True)
class Identity:
    """Whether a checkpoint may be resumed by this run."""

    other_model: bool = False
    """Written for another model shape: never loaded (exit 3)."""
    unrecorded: bool = False
    """Written before run settings were recorded: resumed unchecked (with a warning when this run has settings)."""
    refused: list = field(default_factory=list)
    """Changed run settings not accepted: nothing is loaded (exit 4)."""
    accepted: list = field(default_factory=list)
    """Changed run settings that are accepted (always, or by checkpoint.accept_changes)."""


def identity(saved_signature: Any, signature: Any, saved_run: Any, changes: list, accept: set[str]) -> Identity:
    """Judge a checkpoint's model signature and run settings against this run's. `changes` are the fingerprint
    differences (:func:`training.checkpoint.run_identity.diff`; ignored when `saved_run` is None), `accept` the
    fields a resume may change (checkpoint.accept_changes plus those always accepted)."""
    if saved_signature != signature:
        return Identity(other_model=True)
    if saved_run is None:
        return Identity(unrecorded=True)
    refused = [c for c in changes if c.field not in accept]
    if refused:
        return Identity(refused=refused)
    return Identity(accepted=list(changes))

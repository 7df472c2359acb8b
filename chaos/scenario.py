"""A chaos scenario as every harness tables it: its catalog name, how the harness injects it, what the verdict
expects of it and the checks it adds.

Each platform harness keeps one table of these, built by :func:`table` (``scenarios(...)`` in
``chaos.local.scenarios``, ``chaos.slurm`` and ``chaos.eks``), and its runner reads everything scenario-specific
from the entry, never from the scenario's name. Adding a scenario is its name and description in
``chaos.catalog`` (``SCENARIOS``, ``PLATFORMS``) plus one entry in each table that can inject it (and the fault
itself). A platform that needs more per scenario (the local job's shape, the Slurm node a fault hits) subclasses
:class:`Scenario` with those fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from chaos.catalog import PLATFORMS, SCENARIOS
from chaos.verdict import Check, Expectation, Observation


@dataclass(frozen=True)
class Scenario:
    """One entry of a platform's scenario table.

    Attributes:
        name: a ``chaos.catalog.SCENARIOS`` name (one name means the same fault on every platform).
        inject: how this platform injects the fault, with the harness's own arguments (local: the scenario's
            run; Slurm: the lab and the fault's target; EKS: the run and the pod's index).
        expect: what the verdict requires (``chaos.verdict.judge``).
        checks: the scenario's checks on top of the standard ones, each a function of the observation.
        title: what the harness does, in words, for the report (default: the catalog's description).
    """

    name: str
    inject: Callable[..., Any]
    expect: Expectation
    checks: tuple[Callable[[Observation], Check], ...] = ()
    title: str = ""

    def __post_init__(self) -> None:
        if self.name not in SCENARIOS:
            raise ValueError(f"scenario {self.name!r} is not in chaos.catalog.SCENARIOS: add it there first")
        if not self.title:
            object.__setattr__(self, "title", SCENARIOS[self.name])  # frozen: set once, here


S = TypeVar("S", bound=Scenario)


def table(platform: str, entries: Iterable[S]) -> dict[str, S]:
    """``platform``'s scenarios by name. A table must hold exactly one entry per name the catalog lists for the
    platform (``chaos.catalog.PLATFORMS``): a missing, extra or doubled entry is a harness bug, refused here so that
    it fails when the harness starts, not halfway through a run."""
    entries = list(entries)
    by_name = {s.name: s for s in entries}
    listed = set(PLATFORMS[platform])
    doubled = sorted({s.name for s in entries if sum(e.name == s.name for e in entries) > 1})
    missing, extra = sorted(listed - set(by_name)), sorted(set(by_name) - listed)
    if doubled or missing or extra:
        raise ValueError(
            f"the {platform} scenario table does not match chaos.catalog.PLATFORMS[{platform!r}]: "
            f"no entry for {missing or '-'}, not listed there {extra or '-'}, doubled {doubled or '-'}"
        )
    return by_name

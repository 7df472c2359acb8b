"""One chaos idiom on every platform: each harness keeps a table of ``chaos.scenario.Scenario`` entries (how to
inject the fault, what the verdict expects, the scenario's own checks), exactly one per name ``chaos.catalog``
lists for that platform, so a new scenario is its catalog line plus one entry per platform (and its fault)."""

from __future__ import annotations

import pytest

from chaos import catalog
from chaos.scenario import Scenario, table
from chaos.verdict import Expectation


def platform_tables() -> dict[str, dict[str, Scenario]]:
    from chaos.eks import scenarios as eks_scenarios
    from chaos.local.config import LocalChaosConfig
    from chaos.local.scenarios import scenarios as local_scenarios
    from chaos.slurm import SlurmChaosConfig
    from chaos.slurm import scenarios as slurm_scenarios

    return {
        "local": local_scenarios(LocalChaosConfig()),
        "slurm": slurm_scenarios(SlurmChaosConfig()),
        "eks": eks_scenarios(interval=25, gang=False),
    }


TABLES = platform_tables()


def test_every_platform_has_a_table():
    assert set(TABLES) == set(catalog.PLATFORMS)


@pytest.mark.parametrize("platform", sorted(catalog.PLATFORMS))
def test_each_table_holds_the_shared_type_for_exactly_the_catalogs_names(platform):
    entries = TABLES[platform]
    assert set(entries) == set(catalog.PLATFORMS[platform])  # every catalog name has an entry, and only those
    for name, sc in entries.items():
        assert isinstance(sc, Scenario) and sc.name == name
        assert callable(sc.inject) and isinstance(sc.expect, Expectation)
        assert sc.checks == tuple(sc.checks) and all(callable(c) for c in sc.checks)
        assert sc.title  # the report's title: the platform's words, or the catalog's description


def test_local_titles_are_the_catalog_descriptions():
    assert {n: sc.title for n, sc in TABLES["local"].items()} == {
        n: catalog.SCENARIOS[n] for n in catalog.PLATFORMS["local"]
    }


def entry(name: str) -> Scenario:
    return Scenario(name, inject=lambda run: None, expect=Expectation())


def test_a_table_that_misses_adds_or_doubles_a_scenario_is_refused():
    eks = [entry(n) for n in catalog.PLATFORMS["eks"]]
    assert list(table("eks", eks)) == list(catalog.PLATFORMS["eks"])
    with pytest.raises(ValueError, match=r"no entry for \['node-drain'\]"):
        table("eks", eks[:-1])
    with pytest.raises(ValueError, match=r"not listed there \['hang'\]"):
        table("eks", [*eks, entry("hang")])
    with pytest.raises(ValueError, match=r"doubled \['node-kill'\]"):
        table("eks", [*eks, entry("node-kill")])


def test_a_scenario_must_be_in_the_catalog():
    with pytest.raises(ValueError, match="'meteor-strike' is not in chaos.catalog.SCENARIOS"):
        entry("meteor-strike")
    assert entry("hang").title == catalog.SCENARIOS["hang"]

"""tests/support/file_order.py: the order in which xdist hands out test files (longest first)."""

from __future__ import annotations

from tests.support.file_order import TIER_DEFAULT_S, expected_seconds, load_seconds, longest_first, merged


def test_unit_files_first_then_longest_first_with_ties_in_collection_order():
    files = ["tests/unit/a.py", "tests/e2e/b.py", "tests/unit/c.py", "tests/integration/d.py", "tests/unit/e.py"]
    weight = {"tests/unit/a.py": 1.0, "tests/e2e/b.py": 500.0, "tests/unit/c.py": 1.0, "tests/integration/d.py": 9.0}
    weight["tests/unit/e.py"] = 2.0
    assert longest_first(files, weight) == [
        "tests/unit/e.py",
        "tests/unit/a.py",
        "tests/unit/c.py",
        "tests/e2e/b.py",
        "tests/integration/d.py",
    ]


def test_a_file_the_table_does_not_know_counts_as_its_tiers_typical_file():
    table = {"tests/e2e/known.py": 3.0}
    assert expected_seconds("tests/e2e/known.py", "e2e", table) == 3.0
    assert expected_seconds("tests/e2e/new.py", "e2e", table) == TIER_DEFAULT_S["e2e"]
    assert expected_seconds("tests/unit/new.py", "unit", table) == TIER_DEFAULT_S["unit"]
    assert TIER_DEFAULT_S["e2e"] > TIER_DEFAULT_S["integration"] > TIER_DEFAULT_S["unit"]


def test_a_missing_or_foreign_table_is_no_table(tmp_path):
    assert load_seconds(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert load_seconds(tmp_path / "bad.json") == {}
    (tmp_path / "mixed.json").write_text('{"tests/unit/a.py": 2, "tests/unit/b.py": "x"}')
    assert load_seconds(tmp_path / "mixed.json") == {"tests/unit/a.py": 2.0}


def test_a_run_updates_the_files_it_measured_and_keeps_the_others():
    old = {"tests/unit/a.py": 1.0, "tests/e2e/b.py": 300.0}
    assert merged(old, {"tests/e2e/b.py": 250.04, "tests/integration/c.py": 7.26}) == {
        "tests/e2e/b.py": 250.0,
        "tests/integration/c.py": 7.3,
        "tests/unit/a.py": 1.0,
    }


def test_the_committed_table_covers_the_suite():
    assert len(load_seconds()) > 100  # tests/file_seconds.json: every file of a full run

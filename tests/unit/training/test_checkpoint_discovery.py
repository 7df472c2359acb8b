"""Checkpoint discovery: "latest" is the newest complete checkpoint; incomplete/corrupt ones are skipped;
directories the project did not create are never considered."""

import json

from training.checkpoint import MARKER, OWNED, foreign_entries, is_ours, latest_complete, scan, step_dir, verify


def make(root, step, files, commit=True, truncate=None):
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / OWNED).write_text("{}")
    for name, size in files.items():
        (d / name).write_bytes(b"x" * size)
    if commit:
        (d / MARKER).write_text(json.dumps({"step": step, "files": files, "signature": {}}))
    if truncate:
        (d / truncate).write_bytes(b"x")
    return d


def test_empty_or_missing_dir_means_fresh_start(tmp_path):
    assert latest_complete(tmp_path / "nope") is None
    assert latest_complete(tmp_path) is None


def test_newest_complete_wins_over_newer_incomplete_and_corrupt(tmp_path):
    files = {"__0_0.distcp": 100, "__1_0.distcp": 120, ".metadata": 10}
    make(tmp_path, 10, files)
    good = make(tmp_path, 20, files)
    make(tmp_path, 30, files, commit=False)  # killed mid-save: no marker
    make(tmp_path, 40, files, truncate="__1_0.distcp")  # shard truncated after commit
    (tmp_path / "step_abc").mkdir()  # not a checkpoint name
    (tmp_path / "notes.txt").write_text("hi")
    assert latest_complete(tmp_path) == good
    good_list, bad = scan(tmp_path)
    assert [p.name for p in good_list] == ["step_00000020", "step_00000010"]
    reasons = dict((p.name, why) for p, why in bad)
    assert "no commit marker" in reasons["step_00000030"]
    assert "truncated" in reasons["step_00000040"] and "__1_0.distcp" in reasons["step_00000040"]


def test_missing_file_and_garbled_marker(tmp_path):
    d = make(tmp_path, 5, {"a": 3})
    (d / "a").unlink()
    assert verify(d) == (False, f"file {d / 'a'} is missing")
    d2 = make(tmp_path, 6, {"a": 3})
    (d2 / MARKER).write_text("{not json")
    ok, why = verify(d2)
    assert not ok and "unreadable commit marker" in why


def test_directories_the_project_did_not_create_are_not_checkpoints(tmp_path):
    """A user's own step_1/, step_2/ (or a step_00000010/ without our files) is invisible to discovery and
    retention, and reported as foreign."""
    for name in ("step_1", "step_2", "step_00000010"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(b"mine")
    ours = make(tmp_path, 3, {"a": 3})
    legacy = step_dir(tmp_path, 4)  # written by an earlier version: commit marker, no ownership file
    legacy.mkdir()
    (legacy / "a").write_bytes(b"xyz")
    (legacy / MARKER).write_text(json.dumps({"step": 4, "files": {"a": 3}, "signature": {}}))
    assert not is_ours(tmp_path / "step_1") and is_ours(ours) and is_ours(legacy)
    good, bad = scan(tmp_path)
    assert [p.name for p in good] == ["step_00000004", "step_00000003"] and bad == []
    assert foreign_entries(tmp_path) == ["step_00000010", "step_1", "step_2"]

"""The split-brain scenario's own check, judged on given evidence (commit markers written here, the job's records
and log lines): the fenced run passes; the same run without the fence (the old group's checkpoints completed, no
fence line) fails, and so does a run without the fault."""

import json

from chaos.local.split_brain import FENCE_LINE, STALE_GROUP_FENCED, check_stale_group_fenced
from chaos.verdict import Observation
from training.checkpoint.layout import MARKER, OWNED, step_dir

LINE = (
    "error: this worker group (round 0) was replaced by round 1 (it replaced lost node(s) a, b): "
    f"{FENCE_LINE} of step 8 (not completed); stopping, the job goes on in round 1"
)


def committed(root, step: int, round_: int | None) -> None:
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / OWNED).write_text("{}")
    (d / "x.distcp").write_bytes(b"1234")
    marker = {"step": step, "signature": {}, "files": {"x.distcp": {"size": 4, "crc32c": 0}}}
    if round_ is not None:
        marker["fence"] = {"round": round_, "confirmed": True}
    (d / MARKER).write_text(json.dumps(marker))


def observation(root, records_resumed: int, lines: list[str]) -> Observation:
    records = [
        {"event": "start", "time": 0, "resumed_from": None},
        {"event": "end", "time": 9, "step": 9},
        {"event": "start", "time": 10, "resumed_from": records_resumed},
    ]
    return Observation(records=records, faults=[], logs=[(5.0, x) for x in lines], checkpoint_dir=root)


def test_the_fenced_run_passes(tmp_path):
    committed(tmp_path, 4, 0)  # the old round's, from before the new one restored from it
    committed(tmp_path, 8, 1)
    committed(tmp_path, 12, 1)
    c = check_stale_group_fenced(observation(tmp_path, 4, ["step 5", LINE]))
    assert c.name == STALE_GROUP_FENCED and c.ok, c.detail
    assert c.detail.startswith(LINE) and "{4: 0, 8: 1, 12: 1}" in c.detail


def test_the_same_run_without_the_fence_fails(tmp_path):
    # the old round committed 8 after the new round restored from 4, and nothing stopped it
    committed(tmp_path, 4, 0)
    committed(tmp_path, 8, 0)
    committed(tmp_path, 12, 1)
    c = check_stale_group_fenced(observation(tmp_path, 4, ["step 5"]))
    assert not c.ok and "no line saying" in c.detail and "{8: 0}" in c.detail


def test_an_old_rounds_checkpoint_newer_than_the_restore_fails_even_with_the_line(tmp_path):
    committed(tmp_path, 4, 0)
    committed(tmp_path, 8, 0)  # completed although the line was said (a fence that stopped too late)
    committed(tmp_path, 12, 1)
    c = check_stale_group_fenced(observation(tmp_path, 4, [LINE]))
    assert not c.ok and "of a replaced round or without one: {8: 0}" in c.detail


def test_markers_without_a_round_fail(tmp_path):
    committed(tmp_path, 4, None)  # no fence fields: not a fenced run (c10d, or the fence off)
    committed(tmp_path, 8, None)
    assert not check_stale_group_fenced(observation(tmp_path, 4, [LINE])).ok


def test_a_run_without_the_fault_fails(tmp_path):
    committed(tmp_path, 4, 0)
    committed(tmp_path, 8, 0)
    c = check_stale_group_fenced(observation(tmp_path, 0, ["step 5"]))
    assert not c.ok and "no line saying" in c.detail

"""An agent that starts while its job's store is down (training/launch/rendezvous/start.py): members that refuse the
connection are a wrong setting for an agent whose job never reached its store (exit 2 after the first-contact
window), but an outage for one whose job's store answered these settings before (the note its agents leave in the
job's output directory): then it waits up to the join timeout, saying so. Before, a hot spare or a restarted node
that started during a store outage ended with exit 2, and on Slurm its step's end requeued the whole job."""

from __future__ import annotations

import dataclasses
import json
import socket
import time

import pytest

from training.launch.rendezvous.start import ANSWERED_FILE, StartRefused, check_start, note_answered

WINDOW, JOIN = {"first_contact_timeout": "1", "join_timeout": "4"}, 4.0


def refused_endpoint() -> str:
    """A local port nobody listens on: connections to it are refused, as to a member that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"https://127.0.0.1:{s.getsockname()[1]}"


def start(env: dict[str, str], run_id: str, job_dir) -> tuple[StartRefused, float]:
    t0 = time.monotonic()
    with pytest.raises(StartRefused) as e:
        check_start(run_id, f"out_dir {job_dir}", dict(WINDOW), env=env, job_dir=str(job_dir))
    return e.value, time.monotonic() - t0


def test_the_first_contact_notes_that_the_store_answered_this_job(etcd, tmp_path):
    creds = etcd.add_job_user("answered-note")
    check_start("answered-note", f"out_dir {tmp_path}", {}, env=creds.as_env(), job_dir=str(tmp_path))
    note = json.loads((tmp_path / ANSWERED_FILE).read_text())
    assert note["run_id"] == "answered-note" and note["endpoints"] == sorted(creds.endpoints) and note["at"]


def test_members_down_are_a_setting_for_a_new_job_and_an_outage_for_one_they_answered_before(etcd, tmp_path, capfd):
    creds = dataclasses.replace(etcd.add_job_user("down-at-start"), endpoints=(refused_endpoint(),))
    env = creds.as_env()

    new, took = start(env, "down-at-start", tmp_path / "new")  # never answered this job: a setting, exit 2
    assert new.code == 2 and "never answered this agent within 1 s" in str(new) and "connection refused" in str(new)
    assert took < JOIN, took

    note_answered(str(tmp_path / "other"), "another-run", creds)  # a note of another run id vouches for nothing
    other, _ = start(env, "down-at-start", tmp_path / "other")
    assert other.code == 2

    note_answered(str(tmp_path / "ours"), "down-at-start", creds)  # the same settings reached this job's store
    capfd.readouterr()
    outage, took = start(env, "down-at-start", tmp_path / "ours")
    assert outage.code == 1 and "never served this agent within the join timeout (4 s)" in str(outage), outage
    assert took >= JOIN, took  # waited the join timeout, not the window
    said = capfd.readouterr().err
    assert said.count("[rendezvous] waiting for the membership store (up to the join timeout, 4 s)") == 1, said
    assert "connection refused" in said and "so this is an outage, not a setting" in said, said

"""The goodput ledger counts the failures a failover.in_place job recovered from in place (no new attempt: only
rank 0's ``in_place`` record says so), with their phases and cost; a joiner let in is no failure. Before, such a
run's ledger showed no failure at all and its uninterrupted estimate lost nothing."""

from training.goodput.ledger import ledger_from_records, ledger_text

GLOO = "RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:38"


def _step(step: int, t: float) -> dict:
    return {"event": "step", "time": t, "step": step, "step_time_s": 0.9, "world_size": 2, "loss": 1.0}


def _in_place(t: float, seconds: float, failed: str, held: int, resumed: int) -> dict:
    parts = {"regroup": 2.0, "release": 0.1, "model": 0.4, "restore": 0.5}
    return {
        "event": "in_place",
        "time": t,
        "seconds": seconds,
        "failed": failed,
        "held_step": held,
        "agreed_step": held,
        "resumed_from": resumed,
        "restored_from": {"tier": "peer", "step": resumed},
        "world_size": 2,
        "parts": parts,
    }


def _records() -> list[dict]:
    """Steps 1-5, a peer lost after step 5 (the recovery began at 106 and took 3 s; step 4 restored, step 5 trained
    again), steps 5-10, a joiner let in at step 7's boundary, the end."""
    records = [{"event": "start", "time": 100.0, "resumed_from": 0, "restart_count": 0, "world_size": 2}]
    records += [_step(s, 100.0 + s) for s in range(1, 6)]
    records.append(_in_place(109.0, 3.0, GLOO, held=5, resumed=4))
    records += [_step(s, 105.0 + s) for s in range(5, 8)]
    records.append(_in_place(112.6, 0.5, "", held=7, resumed=7))
    records += [_step(s, 105.6 + s) for s in range(8, 11)]
    return records + [{"event": "end", "time": 115.7, "status": "finished", "step": 10}]


def test_a_failure_recovered_in_place_is_a_row_with_its_phases_and_cost():
    ledger = ledger_from_records("run", _records(), 10)
    assert ledger.attempts == 1 and len(ledger.failures) == 1  # the joiner let in is no failure
    (f,) = ledger.failures
    assert f.how == "recovered in place after RuntimeError: Connection closed by peer [::1]:38"
    assert (f.time, f.step, f.recovery.steps_lost, f.recovery.tier, f.recovery.restarts) == (105.0, 5, 1, "peer", 0)
    assert f.phases == {
        "detect": 1.0,  # the last step's record to the failed collective (the recovery's start)
        "stop_and_rendezvous": 2.0,  # the agreement and the new group
        "startup": 0.0,  # no process started
        "restore": 1.0,  # the rest of the recovery
        "compile": None,
        "first_step": 1.0,  # the in_place record to the first step's
        "recompute": 0.0,  # that step was the held one: back where it was
    }
    assert f.cost_s == 5.0 and ledger.lost_s == 5.0  # step 5's record at 105 -> its record again at 110
    assert ledger.uninterrupted_wall_s == round(ledger.wall_s - 5.0, 3)
    row = next(line for line in ledger_text(ledger).splitlines() if "recovered in place" in line)
    assert row.split()[:4] == ["1", "5", "1", "peer"]


def test_a_recovery_with_no_step_after_it_is_a_row_without_a_cost():
    records = [r for r in _records() if r["event"] != "step" or r["time"] < 109.0]
    (f,) = ledger_from_records("run", records, 10).failures
    assert f.cost_s is None and f.recovery.steps_lost is None and f.recovery.detect_s == 1.0


def test_a_recovery_that_fell_back_is_the_crashed_attempt_that_says_so():
    said = "in-place recovery: epoch 2 not agreed within 10 s (1 checked in, 2 needed): falling back to a full restart"
    records = [r for r in _records() if r["time"] < 106.0]
    records.append({"event": "end", "time": 116.0, "status": "crashed", "step": 5, "detail": said})
    records.append({"event": "start", "time": 120.0, "resumed_from": 5, "restart_count": 1, "world_size": 2})
    records += [_step(s, 116.0 + s) for s in range(6, 11)]
    ledger = ledger_from_records("run", records, 10)
    (f,) = ledger.failures
    assert ledger.attempts == 2 and f.how.startswith("crashed: in-place recovery: epoch 2 not agreed within 10 s")


def test_an_in_place_record_of_the_wrong_shape_is_skipped_not_read():
    import json

    from training.goodput.analysis import scan_records

    bad = {**_in_place(109.0, 3.0, GLOO, held=5, resumed=4), "held_step": "five", "parts": {"regroup": "slow"}}
    text = "\n".join(json.dumps(r) for r in [*_records()[:6], bad, *_records()[7:]]) + "\n"
    records, skipped = scan_records(text)
    assert [s.line for s in skipped] == [7] and 'held_step is "five", not an integer' in skipped[0].why
    assert ledger_from_records("run", records, 10, skipped=skipped).failures == []


def test_a_recovery_that_restored_nothing_is_still_a_row():
    """resumed_from null: the recovery found no state to restore (before any snapshot): held_step steps lost."""
    records = _records()
    records[6] = {**records[6], "resumed_from": None, "held_step": 1}
    (f,) = ledger_from_records("run", records, 10).failures
    assert f.recovery.steps_lost == 1 and f.step == 1


def test_a_joiner_rank_0s_record_is_no_new_attempt_and_counts_the_steps_held_before_the_fault():
    """Rank 0 itself replaced (a silent node in place on gloo): the new rank 0 joined the running epoch, so its
    record is an ``in_place`` one with no held step (it held nothing), not a ``start``. The job stays one attempt,
    its effective steps one history, and the steps recomputed are counted from the last step recorded before the
    fault (step 6), not from the joiner's record."""
    from training.goodput.analysis import effective_steps, record_problem, recovered_in_place, split_attempts

    records = [{"event": "start", "time": 100.0, "resumed_from": 0, "restart_count": 0, "world_size": 2}]
    records += [_step(s, 100.0 + s) for s in range(1, 7)]
    joined = _in_place(110.0, 0.5, "", held=5, resumed=5) | {"held_step": None, "joined": True}
    records += [joined] + [_step(s, 105.5 + s) for s in range(6, 11)]
    records.append({"event": "end", "time": 117.0, "status": "finished", "step": 10})
    assert [record_problem(r) for r in records] == [None] * len(records)
    assert len(split_attempts(records)) == 1
    assert [r["step"] for r in effective_steps(split_attempts(records))] == list(range(1, 11))
    recovery = recovered_in_place("silent node", 106.5, records, None, 108.4)
    assert recovery is not None and recovery.steps_lost == 1 and recovery.restarts == 0
    assert recovery.recover_s == (105.5 + 6) - 106.5


def test_a_joiner_rank_0s_record_counts_from_the_step_the_survivors_agreed_when_rank_0_died_first():
    """Rank 0's node lost after step 6: the survivors finished step 7 (nobody recorded it: rank 0 writes the
    records) and agreed on 7, which the joiner's record says. Recomputed: 7 - 7 = 0, not 6 - 7 = -1."""
    from training.goodput.analysis import held_before

    records = [{"event": "start", "time": 100.0, "resumed_from": 0, "restart_count": 0, "world_size": 2}]
    records += [_step(s, 100.0 + s) for s in range(1, 7)]
    joined = _in_place(110.0, 0.5, "", held=7, resumed=7) | {"held_step": None, "joined": True}
    assert joined["agreed_step"] == 7
    assert held_before(joined, records, 106.5) == 7
    assert held_before(joined | {"agreed_step": 5}, records, 106.5) == 6  # an older agreement: the records' step

"""The snapshot interval policy (training.checkpoint.snapshot_budget) given measured figures: no clocks here."""

from __future__ import annotations

from training.checkpoint.snapshot_budget import Choice, Pace, interval_for, next_interval


def test_the_smallest_interval_within_the_budget():
    # a t5-large-like snapshot on a GPU: 2.2 s blocked against 0.45 s steps, 2% -> ceil(2.2 / 0.009) = 245
    assert interval_for(2.2, 0.45, 0.02, 1000) == 245
    assert interval_for(0.31, 3.1, 0.02, 1000) == 5  # 0.31 / 0.062 = 5.0 exactly: 5 is within (2.0%)
    assert interval_for(0.32, 3.1, 0.02, 1000) == 6
    assert interval_for(0.001, 0.45, 0.02, 1000) == 1  # cheap: every step
    assert interval_for(0.0, 0.45, 0.02, 1000) == 1


def test_bounded_by_the_storage_interval():
    """Past checkpoint.interval the memory tier would bound lost work no better than storage: capped there."""
    assert interval_for(2.2, 0.45, 0.02, 10) == 10
    assert interval_for(5.0, 0.0, 0.02, 10) == 10  # an untimeable step: as rare as allowed


def test_it_goes_up_at_once_and_down_only_with_room():
    assert next_interval(None, 0.31, 3.1, 0.02, 100) == 5
    assert next_interval(5, 0.40, 3.1, 0.02, 100) == 7  # 5 now costs 2.6%: up at once
    # the cost fell a little: 6 would be 1.99%, just within; 7 is kept (no flip-flopping in the log)
    assert next_interval(7, 0.37, 3.1, 0.02, 100) == 7
    # it fell a lot: down to the smallest that stays 20% below the budget (0.2 / (0.016 x 3.1) = 4.03 -> 5)
    assert next_interval(7, 0.20, 3.1, 0.02, 100) == 5


def test_the_log_line_says_the_choice_and_the_lost_work():
    c = Choice(6, 0.31, 3.1, 0.02, 100)
    assert c.line() == (
        "[checkpoint] in-memory snapshot every 6 steps (each blocks 0.31 s of 3.1 s steps: 1.7% of "
        "training time, budget 2%): a failure costs at most 6 steps"
    )
    assert Choice(1, 0.002, 0.45, 0.02, 100).line().startswith("[checkpoint] in-memory snapshot every step (")
    capped = Choice(10, 2.2, 0.45, 0.02, 10).line()
    assert "48.9% of training time, over the budget 2%: at most checkpoint.interval=10" in capped
    assert c.record()["interval"] == 6 and c.record()["mode"] == "auto" and c.record()["detail"] == c.line()


def test_a_fixed_interval_over_budget_is_reported_with_what_auto_would_take():
    p = Pace(budget=0.02, max_interval=100, fixed=1)
    p.add(0.022, 0.45)
    got = p.judge_fixed()
    assert got is not None and got.line() == (
        "[checkpoint] memory_interval=1 costs 4.9% of training time (each blocks 0.022 s of 0.45 s steps), above "
        "checkpoint.memory_budget 2%: `auto` would take every 3 steps"
    )
    within = Pace(budget=0.02, max_interval=100, fixed=3)
    within.add(0.022, 0.45)
    assert within.judge_fixed() is None


def test_averages_follow_a_slower_node_and_report_changes_only():
    p = Pace(budget=0.02, max_interval=100, fixed=None)
    p.add(0.1, 1.0)
    first = p.decide()
    assert first is not None and first.interval == 5
    p.add(0.1, 1.0)
    assert p.decide() is None  # same figures: nothing new to say
    for _ in range(8):  # snapshots got three times dearer (a slower node's memory): the average follows
        p.add(0.3, 1.0)
    got = p.decide()
    assert got is not None and got.interval > 5 and abs(p.cost_s - 0.3) < 0.02

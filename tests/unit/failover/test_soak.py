"""Goodput soak: its settings, its seeded schedule and its sizing (the soak itself is a long run, measured by
``make chaos-test SOAK=10m``, not a test)."""

import pytest

from chaos.local.soak import (
    SOAK_FAULTS,
    SoakConfig,
    SoakConfigError,
    parse_duration,
    schedule,
    seconds_per_step,
    soak_steps,
)


@pytest.mark.parametrize("text,seconds", [("10m", 600), ("90s", 90), ("1h", 3600), ("150", 150), ("2.5m", 150)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "cfg,words",
    [
        (SoakConfig(duration_s=600, every_s=10), "--soak-every 10"),
        (SoakConfig(duration_s=90), "shorter than two fault periods"),
        (SoakConfig(duration_s=600, faults=("worker-kill", "meteor")), "meteor"),
        (SoakConfig(duration_s=600, spares=0), "need a hot spare"),
        (SoakConfig(duration_s=600, spares=0, faults=("worker-kill", "straggler")), "need a hot spare"),
    ],
)
def test_bad_soak_settings_name_the_value(cfg, words):
    with pytest.raises(SoakConfigError, match=words):
        cfg.validate()
    SoakConfig(duration_s=600, spares=0, faults=("worker-kill", "hang")).validate()  # no node fault: no spare needed


def test_schedule_is_seeded_one_fault_per_period_in_its_middle_half():
    cfg = SoakConfig(duration_s=600, seed=7)
    plan = schedule(cfg, 10)
    assert plan == schedule(cfg, 10) and plan[:4] == schedule(cfg, 4)  # drawn in order, reproducible
    assert plan != schedule(SoakConfig(duration_s=600, seed=8), 10)
    for i, p in enumerate(plan):
        assert i * 60 + 15 <= p.at_s <= i * 60 + 45 and p.kind in SOAK_FAULTS
    assert len({p.kind for p in schedule(cfg, 40)}) == len(SOAK_FAULTS)  # every kind comes up


def test_job_is_sized_by_the_uninterrupted_step_time():
    recs = [{"event": "start", "time": 0.0}] + [
        {"event": "step", "step": n, "time": 5.0 + 0.5 * n} for n in range(1, 10)
    ]
    assert seconds_per_step(recs) == 0.5  # from the first step on: start-up is not a step
    assert soak_steps(0.5, 600, 4) == 1200 and soak_steps(0.5, 2, 4) == 12

"""Config precedence and validation: bad values fail fast with a message naming the value and the fix."""

import re
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import pytest

from training.config import ConfigError, check_world, load_config, presets
from training.field_docs import field_docs


def test_presets_exist():
    assert {"debug", "t5-60m", "t5-small", "t5-base", "t5-large", "t5-3b"} <= set(presets())


def test_precedence_defaults_preset_file_cli(tmp_path):
    cfg = load_config([])
    assert cfg.preset == "debug" and cfg.model.d_model == 256 and cfg.train.steps == 100  # preset over default
    f = tmp_path / "c.toml"
    f.write_text("[train]\nsteps = 7\nlr = 0.01\n")
    cfg = load_config(["--config", str(f), "--train.steps", "9"])
    assert cfg.train.steps == 9 and cfg.train.lr == 0.01  # CLI over file over preset
    assert cfg.checkpoint.dir == "runs/debug/checkpoints" and cfg.metrics.path == "runs/debug/metrics.jsonl"
    big = load_config(["--preset", "t5-large"])
    assert (big.model.d_model, big.model.num_layers, big.parallel.precision) == (1024, 24, "bf16")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--train.steps", "0"], "train.steps=0"),
        (["--train.steps", "ten"], "train.steps='ten' is not a valid int"),
        (["--parallel.precision", "fp8"], "parallel.precision='fp8'"),
        (["--checkpoint.keep_last", "0"], "checkpoint.keep_last=0"),
        (["--model.vocab_size", "100"], "model.vocab_size=100"),
        (["--checkpoint.async_save", "maybe"], "checkpoint.async_save='maybe' is not a valid bool"),
        (["--preset", "t5-11b"], "unknown preset 't5-11b'"),
        (["--train.warmup_steps", "-5"], "train.warmup_steps=-5"),
        (["--model.attention", "flash"], "model.attention='flash'"),
    ],
)
def test_bad_values_name_the_value(args, needle):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(args)
    assert needle in str(e.value)


def test_paths_are_values_to_the_parser_and_checked_where_the_job_runs():
    # a submit host outside the cluster parses the pods' paths without looking for them (training.job.check does)
    cfg = load_config(["--data.source", "/fsx/corpus.jsonl", "--model.init_from", "/fsx/weights"])
    assert (cfg.data.source, cfg.model.init_from) == ("/fsx/corpus.jsonl", "/fsx/weights")


def test_unknown_keys_in_file_are_rejected(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nstepz = 3\n")
    with pytest.raises(ConfigError, match="unknown option train.stepz.*valid: train.steps"):
        load_config(["--config", str(f)])


def test_global_batch_must_divide_world():
    cfg = load_config(["--train.global_batch", "6"])
    check_world(cfg, 3)
    with pytest.raises(ConfigError, match="train.global_batch=6 is not divisible by the world size 4"):
        check_world(cfg, 4)


@dataclass
class _Documented:
    """A config documented both ways.

    Attributes:
        both: from the section.
        listed: only in the
            section, over two lines.
    """

    inline: int = 1
    """Written under
    the field."""
    both: int = 2
    """Loses to the section."""
    listed: int = 3
    undocumented: int = 4


def test_field_docs_reads_inline_and_attributes_section_docstrings():
    assert field_docs(_Documented) == {
        "inline": "Written under the field.",
        "both": "from the section.",
        "listed": "only in the section, over two lines.",
    }


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--parallel.init_timeout_s", "inf", "parallel.init_timeout_s=inf must be a finite number"),
        ("--checkpoint.timeout_s", "inf", "checkpoint.timeout_s=inf must be a finite number"),
        ("--train.lr", "nan", "train.lr=nan must be a finite number"),
        ("--parallel.train_timeout_s", "0.001", "parallel.train_timeout_s=0.001 must be >= 1 s"),
        ("--parallel.init_timeout_s", "2", "parallel.init_timeout_s=2.0 must be >= 10 s"),
    ],
)
def test_timeouts_that_cannot_work_are_refused(flag, value, needle):
    """Issue 29: inf was an OverflowError traceback in every rank; 0.001 s timed out every collective."""
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config([flag, value])


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--straggler.factor", "1", "straggler.factor=1.0 must be 0 (off) or > 1"),
        ("--straggler.steps", "0", "straggler.steps=0 must be >= 1"),
        ("--straggler.evict_window_s", "-1", "straggler.evict_window_s=-1.0 must be >= 0 (0 = never take out)"),
    ],
)
def test_straggler_settings_that_cannot_work_are_refused(flag, value, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config([flag, value])


WAITS = [
    f"{s}.{f}"
    for s, f in [
        ("parallel", "init_timeout_s"),
        ("parallel", "train_timeout_s"),
        ("parallel", "heartbeat_timeout_s"),
        ("parallel", "wedge_floor_s"),
        ("checkpoint", "timeout_s"),
        ("checkpoint", "min_timeout_s"),
        ("fault", "slow_commit_s"),
        ("fault", "step_sleep_s"),
        ("straggler", "evict_window_s"),
        ("failover", "in_place_bound_s"),
    ]
]


def test_every_seconds_field_is_listed_here():
    """A new *_s field gets the same bound; this list must name it so the test below covers it."""
    from training.config import SECTIONS, Config

    found = sorted(
        f"{s}.{f.name}" for s in SECTIONS for f in dataclass_fields(getattr(Config(), s)) if f.name.endswith("_s")
    )
    assert found == sorted(WAITS)


@pytest.mark.parametrize("name", WAITS)
def test_a_wait_too_long_for_the_timers_is_refused(name):
    """Round 4, case 1: 1e15 s passed the checks, then timedelta() overflowed at step 1 on every rank."""
    with pytest.raises(ConfigError, match=re.escape(f"{name}=1e+15 must be at most 604800 s (7 days)")):
        load_config([f"--{name}", "1e15"])
    assert "604800" in field_docs(type(getattr(load_config([]), name.split(".")[0])))[name.split(".")[1]]


def test_a_week_is_the_longest_wait_and_allowed():
    cfg = load_config(
        [
            "--parallel.train_timeout_s",
            "604800",
            "--checkpoint.timeout_s",
            "604800",
            "--parallel.init_timeout_s",
            "604800",
        ]
    )
    assert cfg.parallel.train_timeout_s == 604800
    with pytest.raises(ConfigError, match=re.escape("checkpoint.timeout_s=604800.5 must be at most 604800 s")):
        load_config(["--checkpoint.timeout_s", "604800.5"])

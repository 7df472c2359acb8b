"""checkpoint.writer: where async storage saves are written (a thread, or a process per rank), chosen by flag or
TOML, a bad value refused in one line naming it and the fix."""

import pytest

from training.config import ConfigError, load_config


def test_the_writer_is_a_thread_unless_chosen_otherwise():
    assert load_config([]).checkpoint.writer == "thread"
    assert load_config(["--preset", "t5-60m", "--checkpoint.writer", "process"]).checkpoint.writer == "process"


@pytest.mark.parametrize("bad", ["fork", "", "Process"])
def test_a_bad_writer_is_refused_in_one_line_naming_it_and_the_fix(bad):
    with pytest.raises(ConfigError) as e:
        load_config(["--checkpoint.writer", bad])
    line = str(e.value)
    assert "\n" not in line and f"checkpoint.writer={bad!r}" in line and "--checkpoint.writer process" in line

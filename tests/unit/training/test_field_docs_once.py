"""training.field_docs reads a config class's source once per process: ``load_config`` builds its parser from every
section's field docs, and it is called hundreds of times by the tests and by the tools that read presets."""

from __future__ import annotations

from training.config import Config, load_config
from training.field_docs import _field_docs, field_docs


def test_load_config_reads_each_sections_docs_once_per_process():
    load_config(["--preset", "debug"])
    before = _field_docs.cache_info()
    for preset in ("t5-3b", "t5-60m", "debug"):
        load_config(["--preset", preset])
    after = _field_docs.cache_info()
    # no source read again (each read and parse cost 0.2-0.4 s a call: counted here, not timed, on a shared CI host)
    assert after.misses == before.misses and after.hits > before.hits, (before, after)


def test_each_caller_gets_its_own_dict():
    docs = field_docs(type(Config().train))
    assert docs["steps"]
    docs["steps"] = "changed by one caller"
    assert field_docs(type(Config().train))["steps"] != "changed by one caller"

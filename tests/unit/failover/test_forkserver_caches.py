"""The forkserver pays each worker's first argument parse once (training.launch.warm_workers.warm_caches): a worker
forked after it reads no config class's source again (0.13-0.7 s of an in-place replacement's start)."""

from __future__ import annotations

from training.config import parse_args
from training.field_docs import _field_docs
from training.launch.warm_workers import warm_caches


def test_a_worker_forked_after_the_warm_up_parses_its_arguments_from_the_cache():
    _field_docs.cache_clear()
    warm_caches()
    read = _field_docs.cache_info().misses
    assert read >= 9  # the training config's classes, read once
    parse_args(["--preset", "debug", "--train.steps", "3"])
    assert _field_docs.cache_info().misses == read  # nothing read again

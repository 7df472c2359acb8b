"""The built-in corpus's token cache, damaged, is rebuilt from the standard library with one warning. Here, not in
the unit tier (tests/unit/training/test_data.py tests the cache's mechanism on a small corpus in milliseconds):
the rebuild parses the whole standard library, 10 s on 2 cores, a sixth of the unit tier's minute."""

from __future__ import annotations

import logging
from pathlib import Path

from training.config import DataConfig
from training.data.dataset import build_dataset, builtin_cache_path, builtin_tokens


def test_the_builtin_corpus_cache_when_damaged_is_rebuilt(tmp_path, caplog):
    cache = Path(builtin_cache_path(str(tmp_path)))
    cache.write_bytes(b"\x80\x02garbage" * 100)  # before: an UnpicklingError traceback
    with caplog.at_level(logging.WARNING, logger="training.data"):
        assert builtin_tokens(str(tmp_path)).equal(build_dataset(DataConfig(), seed=0).tokens)
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: the cache of the built-in corpus, {cache}, is damaged (torch.load raised UnpicklingError); "
        "rebuilding it"
    ]
    assert builtin_tokens(str(tmp_path)).equal(builtin_tokens())

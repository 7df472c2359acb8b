"""CRC32C in pieces on threads (training.checkpoint.fast_crc): the same checksum as the single-thread one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import pytest
import torch

from training.checkpoint import fast_crc
from training.checkpoint.integrity import crc32c_bytes


def data(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("len_a, len_b", [(0, 0), (0, 5), (5, 0), (1, 1), (63, 4097), (1 << 20, 3), (777, 1 << 16)])
def test_combined_crcs_of_two_parts_are_the_crc_of_both(len_a, len_b):
    a, b = data(len_a, 1), data(len_b, 2)
    whole = int(crc32c_bytes(torch.cat([a, b])), 16)
    assert fast_crc.combine(int(crc32c_bytes(a), 16), int(crc32c_bytes(b), 16), len_b) == whole


@pytest.mark.parametrize("n, piece", [(0, 64), (1, 64), (1000, 64), (4096 * 5 + 17, 4096), (3 << 20, 1 << 20)])
def test_checksums_computed_by_threads_equal_the_single_thread_one(n, piece):
    buf = data(n, n)
    with ThreadPoolExecutor(3) as pool:
        assert fast_crc.crc32c_tensor(buf, pool, piece=piece) == crc32c_bytes(buf)
    assert fast_crc.crc32c_tensor(buf, None, piece=piece) == crc32c_bytes(buf)


def test_the_gil_free_crc_is_the_wheels_own_library_and_agrees_with_it():
    """Canary: google-crc32c's wheel bundles libcrc32c (google_crc32c.libs/); a release that renames or drops it
    makes the snapshot checksums hold the GIL again (still correct, through the fallback). Look here then."""
    assert fast_crc.releases_gil(), "libcrc32c not found in google_crc32c.libs: the checksum threads hold the GIL"
    buf = data(100_003)
    assert fast_crc.extend(0, buf) == google_crc32c.value(bytes(buf.numpy()))
    assert fast_crc.extend(fast_crc.extend(0, buf[:10]), buf[10:]) == fast_crc.extend(0, buf)

"""CRC32C of large in-memory buffers without holding the GIL, in pieces on several threads, combined into one.

The snapshots' checksum is the storage tier's CRC32C (:mod:`training.checkpoint.integrity`, ``google-crc32c``).
That package releases the GIL only for ``bytes`` of 1 MiB or more (``_crc32c.c``: ``PyBytes_Check``); fed a numpy
view of a tensor, as the snapshot copy did, it holds the GIL for the whole call (measured: a 1 GiB update stalled
the other Python threads 102 ms of its 106 ms), so a snapshot's checksum paused the training thread and two
checksum threads ran one at a time. :func:`extend` calls the same C function (``crc32c_extend`` of the wheel's
bundled libcrc32c) through ctypes, which releases the GIL for every foreign call (0 ms stall, same speed); where
the library cannot be found it falls back to ``google_crc32c.extend`` (correct, GIL held). ``crc32c_file``
(bytes read from a file) already released it.

A buffer is checksummed in pieces, each from 0, and :func:`combine` joins the pieces' CRCs in order into the CRC
of the whole (zlib's ``crc32_combine`` for the CRC32C polynomial): the result is bitwise the single-thread one.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from concurrent.futures import Executor

import google_crc32c
import torch

PIECE = 8 << 20  # a checksum piece: large enough that a thread's per-piece Python is noise next to the C loop
_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def _load_library():
    """The wheel's own libcrc32c (auditwheel names it libcrc32c-<hash>.so.N), its crc32c_extend typed; or None."""
    libs = os.path.join(os.path.dirname(os.path.dirname(google_crc32c.__file__)), "google_crc32c.libs")
    for path in sorted(glob.glob(os.path.join(libs, "libcrc32c*.so*"))):
        try:
            lib = ctypes.CDLL(path)  # CDLL (not PyDLL): the GIL is released during every call
            fn = lib.crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        return fn
    return None


_EXTEND = _load_library()


def releases_gil() -> bool:
    """Whether :func:`extend` runs without the GIL (the bundled library was found)."""
    return _EXTEND is not None


def extend(crc: int, data: torch.Tensor) -> int:
    """The CRC32C `crc` (of the bytes before) extended over `data`, a contiguous uint8 CPU tensor."""
    if data.numel() == 0:
        return crc
    if _EXTEND is not None:
        return int(_EXTEND(crc, data.data_ptr(), data.numel()))
    return int(google_crc32c.extend(crc, data.numpy()))


def _multmodp(a: int, b: int) -> int:
    """a x b modulo the CRC polynomial (reflected bit order: bit 31 is x^0)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) mod p, k = 0..31
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


@functools.lru_cache(maxsize=64)
def _shift(nbytes: int) -> int:
    """x^(8 nbytes) mod p: what appending `nbytes` bytes does to the CRC before them (pieces repeat sizes)."""
    p, k, n = 1 << 31, 3, nbytes
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """The CRC32C of A followed by B, from A's CRC, B's CRC and B's length."""
    return _multmodp(_shift(len_b), crc_a) ^ crc_b


def combine_all(crcs: list[tuple[int, int]]) -> int:
    """The CRC32C of consecutive pieces given as (crc, length) in order."""
    crc = 0
    for c, n in crcs:
        crc = combine(crc, c, n)
    return crc


def hexdigest(crc: int) -> str:
    """8 hex digits, the form integrity.hexdigest gives."""
    return f"{crc:08x}"


def crc32c_tensor(data: torch.Tensor, pool: Executor | None = None, piece: int = PIECE) -> str:
    """CRC32C of a contiguous uint8 CPU tensor as 8 hex digits, its pieces checksummed on `pool`'s threads."""
    bounds = [(a, min(a + piece, data.numel())) for a in range(0, data.numel(), piece)]
    if pool is None or len(bounds) < 2:
        return hexdigest(combine_all([(extend(0, data[a:b]), b - a) for a, b in bounds]))
    futures = [pool.submit(extend, 0, data[a:b]) for a, b in bounds]
    return hexdigest(combine_all([(f.result(), b - a) for f, (a, b) in zip(futures, bounds)]))

"""File checksums for checkpoints, shared out over the ranks, and plain-language storage errors.

Every file of a checkpoint gets a CRC32C (``google-crc32c``: hardware-accelerated, about 9 GB/s on one
core here; it releases the GIL for ``bytes`` of 1 MiB or more, which :func:`crc32c_file` reads, so the
background writer's checksums do not stall the training thread). The files are split over the ranks by
size, so each rank reads about 1/world of the checkpoint, when it is written (by the background writer) and
again before it is loaded::

    mine = share(sizes, rank, world)             # the same split on every rank
    sums = {name: crc32c_file(path / name) for name in mine}

The in-memory snapshots use the same checksum on bytes already in memory. Fed a numpy array, as
:func:`crc32c_bytes` and a :func:`checksum`'s ``update`` are, google-crc32c holds the GIL for the whole call:
the snapshots checksum through :mod:`training.checkpoint.fast_crc` instead (the same CRC32C, without the GIL,
in pieces on threads).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import google_crc32c

CHUNK = 8 << 20


def checksum() -> google_crc32c.Checksum:
    """A running CRC32C: ``update(chunk)`` with bytes or a numpy array, then :func:`hexdigest`."""
    return google_crc32c.Checksum()


def hexdigest(c: google_crc32c.Checksum) -> str:
    """The CRC32C so far, as 8 hex digits (the form COMMITTED.json and the snapshots' metadata hold)."""
    return c.hexdigest().decode()


def crc32c_file(path: str | Path) -> str:
    """CRC32C of a file's bytes, as 8 hex digits."""
    c = checksum()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            c.update(chunk)
    return hexdigest(c)


def crc32c_bytes(data) -> str:
    """CRC32C of bytes in memory (a uint8 CPU tensor, a numpy array or bytes), as 8 hex digits; read in CHUNK
    pieces, the way :func:`crc32c_file` reads a file."""
    c = checksum()
    data = data.numpy() if hasattr(data, "numpy") else data  # a torch tensor: its bytes, not a copy
    for a in range(0, len(data), CHUNK):
        c.update(data[a : a + CHUNK])
    return hexdigest(c)


def share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files rank `rank` checksums: largest first to the least-loaded rank (deterministic)."""
    load = [0] * world
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = min(range(world), key=lambda i: (load[i], i))
        owner[name] = r
        load[r] += sizes[name]
    return sorted(n for n, r in owner.items() if r == rank)


_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error (failing storage)",
    errno.ENOTDIR: "a path component is a file, not a directory",
}


def _errors(exc: BaseException, seen: set[int] | None = None):
    """`exc` and every exception inside it: its cause/context chain and DCP's per-rank failures."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    yield exc
    for wrapped in getattr(exc, "failures", {}).values():  # CheckpointException: {rank: (exc, traceback)}
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, BaseException):
            yield from _errors(inner, seen)
    yield from _errors(exc.__cause__, seen)
    yield from _errors(exc.__context__, seen)


def _os_errors(exc: BaseException):
    """Every OSError inside `exc`."""
    return (e for e in _errors(exc) if isinstance(e, OSError))


# What gloo says when a peer of a collective stopped answering (a silent node: its sockets stay open) or went
# away (a killed process: the kernel closes them).
_PEER_SIGNS = (
    ("Timed out waiting", "a peer did not answer in time (silent or hung)"),
    ("Connection closed by peer", "a peer went away (its process ended)"),
    ("Connection reset by peer", "a peer went away (its process ended)"),
)


def peer_reason(exc: BaseException) -> str | None:
    """One line when `exc` is a collective that lost a peer (not a storage problem), else None."""
    for e in _errors(exc):
        text = str(e)
        for needle, reason in _PEER_SIGNS:
            if needle in text:
                return reason
    return None


# Below this much free space a write failure with no errno is taken for a full device: PyTorch's
# stream writer reports a short write as "unexpected pos N vs M" and drops the ENOSPC behind it.
FULL_BELOW = 1 << 20


def storage_reason(exc: BaseException, where: str | Path | None = None) -> str:
    """One line saying why a write or read failed: 'no space left on the device (/ckpt/step_3/...)'.

    `where` is the directory written to: when the exception carries no errno, a nearly full file
    system there is named as the cause (with its free bytes) instead of a library's internal message.
    """
    for e in _os_errors(exc):
        if e.errno in _REASONS:
            loc = f" ({e.filename})" if e.filename else ""
            return f"{_REASONS[e.errno]}{loc}"
        return f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
    if where is not None:
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            free = None
        if free is not None and free < FULL_BELOW:
            return f"{_REASONS[errno.ENOSPC]} ({free} bytes free on {where})"
    text = str(exc).strip()
    for needle, reason in (
        ("No space left", _REASONS[errno.ENOSPC]),
        ("Read-only file system", _REASONS[errno.EROFS]),
        ("Permission denied", _REASONS[errno.EACCES]),
    ):
        if needle in text:
            return reason
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Traceback", "  "))]
    return (lines[-1] if lines else type(exc).__name__)[:300]

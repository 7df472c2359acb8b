"""Unit tests of the pieces that keep checkpoints honest: the non-finite guard, checksums and their split over
ranks, storage error reasons, the run fingerprint and its diff."""

import errno
import os
import zlib

import pytest

from training.config import Config, ConfigError, finalize
from training.errors import Diverged
from training.job.guard import NonFiniteGuard
from training.checkpoint.integrity import crc32c_file, peer_reason, share, storage_reason
from training.checkpoint.run_identity import FIELDS, diff, parse_accept, run_fingerprint


def test_guard_skips_bad_steps_and_stops_after_the_limit():
    g = NonFiniteGuard(max_bad_steps=2)
    assert g.step_ok(1, 2.0, 1.0) and g.ok_to_checkpoint()
    assert not g.step_ok(2, float("nan"), 1.0) and not g.ok_to_checkpoint()
    assert g.step_ok(3, 2.0, 0.5)  # a good step resets the count
    assert not g.step_ok(4, 2.0, float("inf"))
    with pytest.raises(Diverged, match=r"step 5 \(2 bad step\(s\) in a row"):
        g.step_ok(5, float("nan"), float("nan"))


def test_crc32c_is_the_castagnoli_checksum(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"123456789")
    assert crc32c_file(f) == "e3069283"  # the standard CRC-32C check value
    f.write_bytes(os.urandom(20 << 20))
    assert crc32c_file(f) != format(zlib.crc32(f.read_bytes()), "08x")


def test_every_file_is_checksummed_by_exactly_one_rank_and_the_load_is_balanced():
    sizes = {f"__{i}_0.distcp": 1000 + i for i in range(8)} | {".metadata": 10}
    for world in (1, 2, 3, 8, 16):
        parts = [share(sizes, r, world) for r in range(world)]
        flat = [n for p in parts for n in p]
        assert sorted(flat) == sorted(sizes) and len(flat) == len(set(flat))
        loads = [sum(sizes[n] for n in p) for p in parts if p]
        assert max(loads) - min(loads) <= max(sizes.values())


@pytest.mark.parametrize(
    "code, text",
    [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_storage_reason_names_the_cause_through_wrapping(code, text):
    from torch.distributed.checkpoint.api import CheckpointException

    inner = OSError(code, os.strerror(code), "/ckpt/step_3/__0_0.distcp")
    try:
        try:
            raise inner
        except OSError as e:
            raise RuntimeError("write failed") from e
    except RuntimeError as wrapped:
        exc = CheckpointException("save failed", {0: (wrapped, None)})
    assert storage_reason(exc) == f"{text} (/ckpt/step_3/__0_0.distcp)"


def fingerprint(**changes):
    cfg = Config()
    for k, v in changes.items():
        section, field = k.split("__")
        setattr(getattr(cfg, section), field, v)
    return run_fingerprint(finalize(cfg), data_label="builtin", data_digest="abc")


@pytest.mark.parametrize(
    "text, peer",
    [
        (
            "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete",
            "in time",
        ),
        ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5001", "went away"),
        ("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", None),
    ],
)
def test_peer_reason_tells_a_lost_peer_from_a_storage_failure(text, peer):
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = CheckpointException("save", {1: (RuntimeError(text), None)})
    for exc in (RuntimeError(text), wrapped):
        got = peer_reason(exc)
        assert (got is None) if peer is None else (peer in got)
    assert peer_reason(OSError(errno.ENOSPC, "No space left on device")) is None


def test_fingerprint_diff_names_each_changed_field_and_ignores_what_may_change():
    base = fingerprint()
    assert diff(base, fingerprint(train__micro_batch=2, parallel__threads=4, checkpoint__interval=5)) == []
    changed = diff(base, fingerprint(train__lr=0.01, job__seed=7, train__global_batch=16))
    assert [(c.field, c.saved, c.now) for c in changed] == [
        ("job.seed", 1234, 7),
        ("train.lr", 0.001, 0.01),
        ("train.global_batch", 8, 16),
    ]
    moved = dict(base, **{"data.source": {"label": "/new/path.jsonl", "digest": "abc"}})
    assert diff(base, moved) == []  # same content under another name is the same data


def test_accept_changes_are_validated_by_name():
    assert parse_accept("train.lr, data.source") == {"train.lr", "data.source"}
    assert parse_accept("all") == set(FIELDS)
    cfg = Config()
    cfg.checkpoint.accept_changes = "train.lrr"
    with pytest.raises(ConfigError, match="unknown field.*train.lrr"):
        finalize(cfg)


def test_accept_changes_all_only_alone():
    """'all' with other names is a mistake: say so, instead of calling 'all' an unknown field."""
    cfg = Config()
    cfg.checkpoint.accept_changes = "all,train.lr"
    with pytest.raises(ConfigError, match="'all' cannot be combined with other fields; pass either all or a list"):
        finalize(cfg)

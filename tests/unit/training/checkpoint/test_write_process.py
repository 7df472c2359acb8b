"""A failed write in the writer process reaches the trainer as plain exceptions that pickle, and the failure's
words are the same as for a write in the trainer: a full device is named as such, a lost peer as a lost peer."""

import errno
import pickle

from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint.integrity import peer_reason, storage_reason
from training.checkpoint.write_process import portable, rebuilt


def _through_the_pipe(exc: BaseException) -> BaseException:
    return rebuilt(pickle.loads(pickle.dumps(portable(exc))))


def test_a_full_device_inside_dcps_per_rank_failures_is_still_a_full_device():
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step_00000003/__0_0.distcp")
    exc = CheckpointException("save failed", {0: (full, None)})
    got = _through_the_pipe(exc)
    assert (
        storage_reason(got) == storage_reason(exc) == ("no space left on the device (/ckpt/step_00000003/__0_0.distcp)")
    )


def test_a_lost_peer_is_still_a_lost_peer_and_a_cause_is_kept():
    try:
        try:
            raise RuntimeError("[pair.cc:537] Read error: Connection reset by peer")
        except RuntimeError as inner:
            raise ValueError("gather failed") from inner
    except ValueError as e:
        exc = e
    got = _through_the_pipe(exc)
    assert peer_reason(got) == peer_reason(exc) == "a peer went away (its process ended)"
    assert str(got) == "gather failed"


def test_an_exception_without_words_is_named_by_its_type():
    assert str(_through_the_pipe(EOFError())) == "EOFError"

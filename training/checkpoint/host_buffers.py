"""The host memory both checkpoint tiers reuse from one save to the next, kept by a survivor of an in-place recovery.

Each tier copies the training state into host buffers it allocates once (page-locked on GPUs: that is what makes a
device-to-host copy fast and asynchronous): the storage tier's staging buffers (:class:`ReusedBufferStager`) and the
memory tier's snapshot pieces (:class:`HostPieces`). For t5-large that is ~8.6 GB a rank each, and pinning them
takes seconds. An in-place recovery builds both tiers again on the new group (their gloo groups went with the old
one); without this a survivor threw its buffers away and paid the pinning again, on the recovery's critical path,
for memory it already had. The old manager hands them over (:meth:`HostBuffers.hand_over`) and the new one adopts
them; a tier whose state changed shape (a world-size change) allocates anew only what no longer fits.

Safe against the old tiers' abandoned work: a tier writes into these buffers only on the training thread (the
staging copy, the side stream's copies queued at a snapshot's start), which has moved on to the new tiers. A save or
snapshot left in flight by the recovery only reads them, and publishes nothing (it is abandoned: never committed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.checkpoint.snapshot_copy import HostPieces
from training.checkpoint.staging import ReusedBufferStager


@dataclass
class HostBuffers:
    """The storage tier's staging buffers and the memory tier's snapshot pieces of one rank."""

    stager: ReusedBufferStager
    pieces: HostPieces = field(default_factory=HostPieces)

    @classmethod
    def new(cls, *, shared: bool) -> "HostBuffers":
        """Empty buffers; ``shared``: staging in shared memory, for a writer process (checkpoint.writer)."""
        return cls(stager=ReusedBufferStager(shared=shared))

    def hand_over(self) -> "HostBuffers":
        """The same memory in new holders, for the next tiers; these holders keep none of it (the old tiers' close
        then frees nothing the new ones use)."""
        return HostBuffers(stager=self.stager.hand_over(), pieces=self.pieces.hand_over())

    @property
    def nbytes(self) -> int:
        return self.stager.nbytes + self.pieces.nbytes

    @property
    def allocations(self) -> int:
        """Buffers these holders made (none while what was handed over fits)."""
        return self.stager.allocations + self.pieces.allocations

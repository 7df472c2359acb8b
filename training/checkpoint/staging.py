"""Checkpoint staging into host buffers that are allocated once and reused by every later save.

An async save first copies the training state somewhere training cannot change it ("staging"), then
writes that copy in the background. DCP's default stager allocates a fresh, unpinned host copy of the
whole state on every save; for t5-large on one H100 that blocked training 8.7 s per save (14 steps).
:class:`ReusedBufferStager` keeps one host buffer per tensor for the life of the run (page-locked on
CUDA, so the device-to-host copy runs at full PCIe speed), so a save costs one copy into memory that
already exists: 0.61 s there, after a first save of 7.7 s that allocates and pins the buffers. Staged
DTensors keep their local shard in that host buffer (the writer reads only local shards), never a copy on
the mesh's device. Tested with torch 2.13 on CPUs and 2.11 on CUDA.

    stager = ReusedBufferStager()
    dcp.async_save(state, checkpoint_id=path, async_stager=stager)
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor


class ReusedBufferStager(AsyncStager):
    """Copies a state dict into per-tensor host buffers kept between saves; returns the staged copy.

    Staging is synchronous: when ``stage`` returns, the copy is complete and training may change the
    originals. Buffers are keyed by the tensor's path in the state dict, so the previous save's write
    must have finished before the next ``stage`` (the checkpoint manager keeps one save in flight).
    """

    # stage() has already finished copying when it returns: DCP need not call synchronize_staging().
    _synchronize_after_execute = False

    def __init__(self, *, shared: bool = False):
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations = 0  # buffers made so far (a reused set makes none)
        self._from_cuda = False
        # For a writer process (checkpoint.writer=process): buffers in shared memory, so a save sends the writer
        # their handles, never the bytes. Not page-locked then: a GPU's copy into them is a plain one.
        self.shared = shared

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._from_cuda = False
        staged = self._copy(state_dict, "")
        if self._from_cuda:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies have landed
        return staged

    def _buffer_for(self, path: str, t: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            # Page-locked only for GPU tensors: that is what makes their copy fast (and non-blocking).
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda and not self.shared)
            if self.shared:
                buf.share_memory_()
            self._buffers[path] = buf
            self.allocations += 1
        return buf

    def allocate(self, state_dict: dict[str, Any]) -> None:
        """Make now, copying nothing, the buffers :meth:`stage` will copy this state into (page-locked or shared as
        there): what the first save would otherwise pay on a training step. Buffers that fit are kept."""
        self._copy(state_dict, "", fill=False)

    def _copy(self, x: Any, path: str, fill: bool = True) -> Any:
        if isinstance(x, DTensor):
            # Wrap the host buffer with the original's spec (mesh, placements, global shape and stride).
            # DTensor.from_local would move the buffer to the mesh's device: on CUDA every save would
            # allocate a new GPU copy of the whole shard and copy it back (torch's own CPU staging,
            # _state_dict_utils._create_cpu_state_dict, also keeps a CPU local tensor under a CUDA mesh).
            return DTensor(self._copy(x.to_local(), path, fill), x._spec, requires_grad=False)
        if isinstance(x, torch.Tensor):
            buf = self._buffer_for(path, x)
            if fill:
                buf.copy_(x.detach(), non_blocking=x.is_cuda and not self.shared)
                self._from_cuda |= x.is_cuda
            return buf
        if isinstance(x, dict):
            return {k: self._copy(v, f"{path}/{k}", fill) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(self._copy(v, f"{path}/{i}", fill) for i, v in enumerate(x))
        return copy.deepcopy(x)  # numbers, strings, small objects: a private copy for the writer thread

    def hand_over(self) -> "ReusedBufferStager":
        """A stager with this one's buffers, for the next storage tier (training.checkpoint.host_buffers); this one
        keeps none, so its close frees nothing the next one uses."""
        kept = ReusedBufferStager(shared=self.shared)
        kept._buffers, self._buffers = self._buffers, {}
        return kept

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` is synchronous."""

    def close(self) -> None:
        self._buffers.clear()

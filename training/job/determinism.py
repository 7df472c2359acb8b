"""Deterministic mode (``parallel.deterministic``): the settings that make GPU kernels reproducible.

Call :func:`apply_determinism` before the first CUDA kernel (cuBLAS reads its workspace setting when its
handle is created). With it on, a GPU run and its resume can be compared bitwise wherever the kernels have a
deterministic implementation; an op that has none raises at its first use, naming it.
"""

from __future__ import annotations

import os

import torch

# cuBLAS picks reduction splits by workspace size; a fixed workspace per stream makes its GEMMs reproducible
# (https://docs.nvidia.com/cuda/cublas/#results-reproducibility).
CUBLAS_WORKSPACE = ":4096:8"


def apply_determinism(enabled: bool) -> None:
    """Turn deterministic kernels on for this process (no-op when `enabled` is False)."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # autotuning may pick a different algorithm per run

"""Warm workers (training.launch.warm_workers): torchrun's command for the training module becomes a function
started by a preloaded forkserver; what a warm worker computes is bitwise what a cold one does."""

from __future__ import annotations

import subprocess
import sys


from tests.conftest import ROOT


def test_the_forkserver_preload_calls_no_cuda_api():
    """A CUDA driver initialized in the forkserver would be unusable in every forked worker on a GPU node."""
    code = """
import importlib, torch
calls = []
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_capability",
             "is_bf16_supported", "set_device"):
    orig = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _o=orig, **k: (calls.append(_n), _o(*a, **k))[1])
from training.launch.warm_workers import PRELOAD
for m in PRELOAD:
    importlib.import_module(m)
print(calls, torch.cuda.is_initialized())
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "[] False", p.stdout

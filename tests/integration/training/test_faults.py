"""Fault injection is one object (training.job.faults.Faults) that does nothing unless a fault.* setting is on."""

from __future__ import annotations

import subprocess
import sys


from tests.conftest import ROOT


def test_a_process_fault_happens_once_per_out_dir(tmp_path):
    code = (
        "import sys; from training.config import FaultConfig; from training.job.faults import Faults; "
        "Faults(FaultConfig(sigkill_at_step=2), rank=0, out_dir=sys.argv[1]).after_step(2); print('alive')"
    )
    first = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == -9 and "[fault] rank 0 SIGKILLs itself after step 2" in first.stdout
    again = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == "alive"  # the restarted job is not killed again

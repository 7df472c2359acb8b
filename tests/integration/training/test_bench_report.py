"""`python -m training.bench report`: the table and target lines `make bench` prints, from result files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from training import bench


def _row(preset: str, step_s: float, async_s: float, base_s: float, **extra) -> dict:
    blocks = {"async": async_s, "sync": 2.5, "baseline": base_s}
    return {
        "preset": preset,
        "params": 63.1e6,
        "world_size": 2,
        "device": "cpu",
        "step_s": step_s,
        "tokens_per_s": 353.0,
        "mfu": None,
        "ckpt_block_s": blocks,
        "ckpt_block_over_step": {k: v / step_s for k, v in blocks.items()},
        "baseline_over_async": base_s / async_s,
        "step_s_during_async_write": 5.0,
        **extra,
    }


def test_report_prints_first_save_steady_state_and_target_verdicts(tmp_path, capsys):
    met = tmp_path / "met.json"
    met.write_text(
        json.dumps(
            _row(
                "t5-60m",
                3.5,
                0.175,
                2.95,
                ckpt_block_first_async_s=0.9,
                checksum_s=0.12,
                async_write_s=8.0,
                checksum_over_async_write=0.015,
            )
        )
    )
    missed = tmp_path / "missed.json"
    missed.write_text(json.dumps(_row("t5-60m", 3.5, 0.7, 2.8)))  # no first-save figure: an older result file
    summary = tmp_path / "summary.json"
    assert bench.main(["report", str(met), str(missed), "--json", str(summary)]) == 0
    out = capsys.readouterr().out
    assert "1st async" in out.splitlines()[0]
    assert "0.900" in out and "nan" in out  # the first save when recorded, a visible gap when not
    assert (
        "t5-60m: checkpoint checksums (CRC32C, each rank its share, in the background writer) 0.120 s of the "
        "8.00 s async save = 1.5%" in out
    )
    verdicts = [line for line in out.splitlines() if line.startswith("targets (t5-60m)")]
    assert "5.0% MET" in verdicts[0] and "16.9x MET" in verdicts[0]
    assert "20.0% MISSED" in verdicts[1] and "4.0x MISSED" in verdicts[1]
    assert [r["preset"] for r in json.loads(summary.read_text())] == ["t5-60m", "t5-60m"]


def test_step_only_results_get_a_table_of_settings_mfu_and_peak_memory(tmp_path, capsys):
    files = []
    for variant, mfu, peak in (
        ("--model.attention eager --parallel.compile off", 0.080, 61.2),
        ("--model.attention sdpa_bias --parallel.compile on", 0.312, 40.5),
    ):
        f = tmp_path / f"{len(files)}.json"
        f.write_text(
            json.dumps(
                {
                    "preset": "t5-large",
                    "variant": variant,
                    "device": "NVIDIA H100 80GB HBM3",
                    "step_s": 0.495,
                    "tokens_per_s": 40470.0,
                    "mfu": mfu,
                    "peak_gpu_gb": peak,
                    "warmup_s": 31.0,
                }
            )
        )
        files.append(str(f))
    assert bench.main(["report", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "1st async" not in "\n".join(lines)  # no save figures: no save table
    rows = [line for line in lines if line.startswith("t5-large")]
    assert (
        "8.0%" in rows[0] and "61.2" in rows[0] and rows[0].endswith("--model.attention eager --parallel.compile off")
    )
    assert "31.2%" in rows[1] and "40.5" in rows[1] and "31.0" in rows[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script would run the whole matrix")
def test_the_gpu_matrix_refuses_to_run_without_a_gpu_and_says_what_to_set():
    r = subprocess.run(
        ["bash", "scripts/bench_gpu.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert r.returncode == 3
    assert "no CUDA device visible" in r.stderr and "PYTHON=" in r.stderr

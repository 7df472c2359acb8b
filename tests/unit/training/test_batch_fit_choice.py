"""python -m training.batch_fit choosing from a GPU run's measured peaks (--measured: no GPU needed): the micro-batch
for the launcher's plan; a plan no world can run, or a file that is no fit, said in one line (exit 2) before any GPU
time is spent; on a CPU, asked to measure, a refusal in one line (exit 3). Measuring on a GPU:
tests/integration/training/test_batch_fit_cli.py."""

from __future__ import annotations

import json

import pytest
import torch

from training import batch_fit

# t5-large's peaks as a GPU run would write them (its --out): 11.5 GB of state + 1.25 GB per sample
MEASURED = {"device": "NVIDIA H200", "capacity_gb": 139.8, "peaks_gb": {"2": 14.0, "4": 16.5, "8": 21.5}}


@pytest.fixture
def measured(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(MEASURED))
    return str(path)


def test_the_preset_plan_keeps_its_share_and_one_gpu_takes_its_whole_share(measured, tmp_path, capsys):
    # the GPU presets' job: 2 nodes x 8 GPUs, global batch 256, down to 1 node
    out = tmp_path / "plan.json"
    plan = ["--preset", "t5-large", "--nodes", "2", "--min-nodes", "1", "--nproc-per-node", "8"]
    assert batch_fit.main([*plan, "--measured", measured, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "peak GB at micro-batch 2: 14.00, 4: 16.50, 8: 21.50 -> 11.50 + 1.250 x m" in said
    assert "train.micro_batch = 16: the GPU holds 91 samples" in said  # (139.8 x 0.9 - 11.5) / 1.25 = 91.5
    assert "16 at 16 ranks = 1 x 16, 32 at 8 ranks = 2 x 16" in said
    record = json.loads(out.read_text())
    assert (record["micro_batch"], record["plan"]["global_batch"]) == (16, 256)
    assert record["predicted_peak_gb"] == pytest.approx(31.5)
    # bench_gpu.sh's one GPU at batch 32: the whole share in one forward/backward
    one_gpu = ["--preset", "t5-large", "--nodes", "1", "--nproc-per-node", "1", "--measured", measured]
    assert batch_fit.main([*one_gpu, "--", "--train.global_batch", "32"]) == 0
    said = capsys.readouterr().out
    assert "train.micro_batch = 32: " in said and "32 at 1 ranks = 1 x 32" in said


def test_a_plan_no_world_runs_and_a_file_that_is_no_fit_are_one_line_and_exit_2(tmp_path, capsys):
    assert batch_fit.main(["--preset", "t5-large", "--nodes", "3", "--nproc-per-node", "8"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.strip() == (
        "batch_fit: train.global_batch=256 does not divide by the planned world sizes [24] (1..3 nodes x 8): use a "
        "multiple of 48 (e.g. --train.global_batch 240) or raise --min-nodes"
    )
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"step_s": 0.4}))
    assert (
        batch_fit.main(["--preset", "t5-large", "--nodes", "2", "--nproc-per-node", "8", "--measured", str(bad)]) == 2
    )
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"--measured {bad} is not a batch_fit --out file ('peaks_gb')" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: it measures (tests/integration)")
def test_on_a_cpu_it_refuses_to_measure_in_one_line(capsys):
    assert batch_fit.main(["--preset", "t5-large", "--nodes", "2", "--nproc-per-node", "8"]) == 3
    said = capsys.readouterr()
    assert said.out == "" and len(said.err.strip().splitlines()) == 1
    assert said.err.startswith(f"batch_fit: no CUDA device visible (torch {torch.__version__}): the fit needs a GPU's")
    assert "run it on a GPU machine, or pass --measured FILE (a GPU run's --out)" in said.err

"""Warm workers (training.launch.warm_workers): torchrun's command for the training module becomes a function
started by a preloaded forkserver; what a warm worker computes is bitwise what a cold one does."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY
from training.launch.warm_workers import WARM_ENV, apply_warm_start, enabled, run_worker


def _torchrun_config(*argv: str):
    from torch.distributed.run import config_from_args, parse_args
    return config_from_args(parse_args(["--nnodes=1", "--nproc-per-node=2", *argv]))


def test_the_training_module_becomes_a_forkserver_function_with_its_arguments():
    config, cmd, args = _torchrun_config("--module", "training", "--preset", "debug", "--train.steps", "3")
    assert (config.start_method, cmd, args[:3]) == ("spawn", sys.executable, ["-u", "-m", "training"])
    config, cmd, args = apply_warm_start(config, cmd, args)
    assert config.start_method == "forkserver" and cmd is run_worker
    assert args == ["--preset", "debug", "--train.steps", "3"]


@pytest.mark.parametrize("argv", [("--module", "other_module", "--x"), ("train.py", "--x")])
def test_anything_but_the_training_module_starts_as_torchrun_would(argv):
    config, cmd, args = _torchrun_config(*argv)
    assert apply_warm_start(config, cmd, list(args)) == (config, cmd, args)
    assert config.start_method == "spawn"


def test_the_switch_is_on_unless_turned_off_and_a_bad_value_is_named():
    assert all(enabled(env) for env in ({}, {WARM_ENV: ""}, {WARM_ENV: "1"}, {WARM_ENV: " Yes "}))
    assert not any(enabled({WARM_ENV: v}) for v in ("0", "false", "OFF", "no"))
    with pytest.raises(ValueError, match=r"T5_WARM_WORKERS='maybe' is neither true nor false: use 1/true"):
        enabled({WARM_ENV: "maybe"})


def _train(out, env_extra: dict) -> tuple[dict, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env_extra}
    p = subprocess.run([sys.executable, "-m", "training.launch", "--nodes", "2", "--", *TINY,
                        "--job.out_dir", str(out), "--train.steps", "4"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    starts = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in starts if r["event"] == "start"), p.stdout + p.stderr


@pytest.mark.e2e
def test_warm_workers_skip_the_imports_and_train_bitwise_like_cold_ones(tmp_path):
    warm, _ = _train(tmp_path / "warm", {})
    cold, _ = _train(tmp_path / "cold", {WARM_ENV: "0"})
    assert warm["startup"]["preloaded"] is True and cold["startup"]["preloaded"] is False
    ckpts = [sorted((tmp_path / run / "checkpoints").glob("step_*"))[-1] for run in ("warm", "cold")]
    cmp = subprocess.run([sys.executable, "-m", "training.compare", *map(str, ckpts)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0 and "EQUAL" in cmp.stdout, cmp.stdout + cmp.stderr


def test_a_worker_exit_is_logged_without_torchs_join_traceback_and_a_raise_keeps_its_own(caplog):
    import logging

    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from training.launch.warm_workers import drop_exit_tracebacks
    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    drop_exit_tracebacks()
    for exc in (ProcessExitedException("process 0 terminated with signal SIGKILL", 0, 123, -9, "SIGKILL"),
                ProcessRaisedException("worker traceback", 0, 123)):
        try:
            raise exc
        except Exception:
            log.exception("failed (exitcode: -9) local_rank: 0")
    exited, raised = [r for r in caplog.records if r.name == log.name][-2:]
    assert exited.exc_info is None and raised.exc_info is not None


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

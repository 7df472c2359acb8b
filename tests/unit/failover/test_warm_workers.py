"""Warm workers (training.launch.warm_workers): torchrun's command for the training module becomes a function
started by a preloaded forkserver; what a warm worker computes is bitwise what a cold one does."""

from __future__ import annotations

import sys

import pytest

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


def test_a_worker_exit_is_logged_without_torchs_join_traceback_and_a_raise_keeps_its_own(caplog):
    import logging

    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from training.launch.warm_workers import drop_exit_tracebacks

    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    drop_exit_tracebacks()
    for exc in (
        ProcessExitedException("process 0 terminated with signal SIGKILL", 0, 123, -9, "SIGKILL"),
        ProcessRaisedException("worker traceback", 0, 123),
    ):
        try:
            raise exc
        except Exception:
            log.exception("failed (exitcode: -9) local_rank: 0")
    exited, raised = [r for r in caplog.records if r.name == log.name][-2:]
    assert exited.exc_info is None and raised.exc_info is not None

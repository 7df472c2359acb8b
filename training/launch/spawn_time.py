"""Each worker learns when its agent started it: ``T5_SPAWN_TIME`` in its environment (epoch seconds).

The worker's start-up clock (:mod:`training.job.startup`) begins its first phase, ``process_start``, there, so a
restart's breakdown holds the time from the agent's request to the worker's ``main()``: fork and exec and the
interpreter for a cold worker, the forkserver's round trip for a warm one (:mod:`training.launch.warm_workers`),
which ``/proc``'s start time of the process cannot see.

torchrun builds the workers' environments in its agent and hands them, one dict per local rank, to the ``LogsSpecs``
of the launch (``LaunchConfig.logs_specs``, its public extension point for where worker logs go) right before it
starts the processes. :class:`SpawnStamped` wraps the launch's own ``LogsSpecs``: it stamps the time into each
environment and leaves the logs to the wrapped one. Both start methods pass those environments on (a subprocess's
environment; ``os.environ`` of a forked warm worker).
"""

from __future__ import annotations

import time

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from training.job.startup import SPAWN_TIME_ENV


class SpawnStamped(LogsSpecs):
    """``inner``'s log destinations; each worker's environment gets ``T5_SPAWN_TIME`` = now."""

    def __init__(self, inner: LogsSpecs) -> None:
        super().__init__()
        self.inner = inner

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = self.inner.reify(envs)  # creates the attempt's log directories: part of the start, stamped after
        now = repr(time.time())
        for env in envs.values():
            env[SPAWN_TIME_ENV] = now
        return dest

    @property
    def root_log_dir(self) -> str:
        return self.inner.root_log_dir


def stamp_spawn_time(config):
    """``config`` (torchrun's ``LaunchConfig``) with its ``logs_specs`` wrapped in :class:`SpawnStamped`."""
    if not isinstance(config.logs_specs, SpawnStamped):
        config.logs_specs = SpawnStamped(config.logs_specs)
    return config

"""What the local chaos harness runs: one typed config for the job, the reference run and every scenario."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Files whose content changes the training math: a cached reference run is only valid for the same code.
# The launcher, the store, process lifetime, the run lock and this harness only decide *when* processes run,
# not what they compute. (training/launch/ is not hashed: only the other rooms' modules and the presets are.)
_NOT_MATH = {
    "rdzv_store.py",
    "compare.py",
    "__main__.py",
    "lifecycle.py",
    "run_lock.py",
    "watchdog.py",
    "startup.py",
    "compile_cache.py",
    "progress.py",
    "recovery.py",
}


class LocalChaosConfigError(ValueError):
    """A chaos setting that cannot work (the message names the value and the fix)."""


@dataclass(frozen=True)
class LocalChaosConfig:
    """The job every scenario runs (and the uninterrupted reference it is compared with).

    Attributes:
        nodes: simulated nodes (torchrun agents on loopback).
        nproc_per_node: worker processes per node.
        preset: training preset (``training/presets/<preset>.toml``).
        steps: optimizer steps of the job.
        global_batch: samples per step, fixed across world sizes: must divide by every world size the job
            passes through (``nproc_per_node`` x each node count from ``nodes - 1`` to ``nodes``).
        warmup_steps: learning-rate warm-up (the presets' value can exceed a short chaos job).
        interval: storage checkpoint every this many steps (what a failure costs when memory cannot help).
        memory_interval: in-memory snapshot every this many steps (0 = off): a failure at the same world
            size then loses at most this many steps (the scenarios that test the storage tier turn it off).
        train_timeout_s: process-group timeout after step 1: how long a hung peer blocks the others.
        heartbeat_timeout_s: the workers' heartbeat watchdog (``--parallel.heartbeat_timeout_s``): a silent
            peer (stopped node, hung worker) is declared after this long.
        wedge_floor_s: the least time a rank may stay in one phase of a step before it is declared wedged
            (``--parallel.wedge_floor_s``; below ``train_timeout_s``, whose process-group timeout would come first).
        max_restarts: torchrun ``--max-restarts`` (``restarts-exhausted`` exceeds it on purpose).
        slow_commit_s: ``kill-during-save`` widens the "async checkpoint written, not yet committed" window by this.
        atol: tolerance for the final weights when the world size changed (``node-loss-rejoin``).
        extra_args: further training flags for every run, e.g. ``("--model.num_layers", "2")``.
        scenario_timeout_s: a scenario still running after this is stopped and fails.
        coordinator: where the agents keep their membership: ``etcd`` (3 members on loopback, the launcher's
            default) or ``store`` (torch's c10d rendezvous on the standalone store, as the clusters today);
            the ``store-*`` scenarios need etcd.
        store_outage_s: how long ``store-outage`` keeps every etcd member stopped.
    """

    nodes: int = 2
    nproc_per_node: int = 1
    preset: str = "debug"
    steps: int = 16
    global_batch: int = 8
    warmup_steps: int = 2
    interval: int = 4
    memory_interval: int = 1
    train_timeout_s: int = 10
    heartbeat_timeout_s: float = 5.0
    wedge_floor_s: float = 5.0
    max_restarts: int = 3
    slow_commit_s: float = 6.0
    atol: float = 1e-4
    extra_args: tuple[str, ...] = ()
    scenario_timeout_s: float = 300.0
    coordinator: str = "etcd"
    store_outage_s: float = 20.0

    @property
    def kill_step(self) -> int:
        """Faults are injected once this step is logged: mid-interval, so a SIGKILL loses steps."""
        return self.interval + 2

    @property
    def world(self) -> int:
        return self.nodes * self.nproc_per_node

    def validate(self) -> None:
        if self.nodes < 2:
            raise LocalChaosConfigError(f"nodes={self.nodes}: node-loss scenarios need at least 2 nodes (NODES=2)")
        if self.nproc_per_node < 1:
            raise LocalChaosConfigError(f"nproc_per_node={self.nproc_per_node} must be >= 1")
        for n in (self.nodes - 1, self.nodes):
            w = n * self.nproc_per_node
            if self.global_batch % w:
                raise LocalChaosConfigError(
                    f"global_batch={self.global_batch} does not divide by world size {w} ({n} node(s) x "
                    f"{self.nproc_per_node} proc), which node-loss-rejoin passes through; use a multiple of "
                    f"{_lcm(self.nodes * self.nproc_per_node, (self.nodes - 1) * self.nproc_per_node)}"
                )
        if self.interval < 2:
            raise LocalChaosConfigError(f"interval={self.interval}: use >= 2 so a kill lands between checkpoints")
        if self.steps < 3 * self.interval:
            raise LocalChaosConfigError(
                f"steps={self.steps} < 3 x interval ({3 * self.interval}): scenarios need "
                f"room to fail, resume and fail again"
            )
        if not 0 <= self.warmup_steps <= self.steps:
            raise LocalChaosConfigError(f"warmup_steps={self.warmup_steps} must be in 0..steps={self.steps}")
        if self.memory_interval < 0:
            raise LocalChaosConfigError(f"memory_interval={self.memory_interval} must be >= 0 (0 = off)")
        if self.train_timeout_s < 1:
            raise LocalChaosConfigError(f"train_timeout_s={self.train_timeout_s} must be >= 1")
        if self.coordinator not in ("etcd", "store"):
            raise LocalChaosConfigError(f"coordinator={self.coordinator!r}: use etcd (the default) or store")
        if self.store_outage_s <= 0:
            raise LocalChaosConfigError(f"store_outage_s={self.store_outage_s:g} must be > 0")

    def training_args(self, out_dir: str | Path, *extra: str) -> list[str]:
        """Training-module flags shared by the reference and every scenario (plus ``extra``)."""
        return [
            "--preset",
            self.preset,
            "--job.out_dir",
            str(out_dir),
            "--train.steps",
            str(self.steps),
            "--train.global_batch",
            str(self.global_batch),
            "--train.warmup_steps",
            str(self.warmup_steps),
            "--checkpoint.interval",
            str(self.interval),
            "--checkpoint.keep_last",
            "3",
            "--checkpoint.memory_interval",
            str(self.memory_interval),
            "--checkpoint.async_save",
            "true",
            "--parallel.threads",
            "1",
            "--metrics.log_every",
            "1",
            "--parallel.heartbeat_timeout_s",
            f"{self.heartbeat_timeout_s:g}",
            "--parallel.wedge_floor_s",
            f"{self.wedge_floor_s:g}",
            *self.extra_args,
            *extra,
        ]

    def reference_key(self, math_args: tuple[str, ...] = ()) -> str:
        """Hash of everything that decides the reference run's final weights (config + training code).

        ``math_args``: scenario-specific training flags that change the result (e.g. dropout off for b).
        """
        math = {
            k: v
            for k, v in asdict(self).items()
            if k
            in ("nodes", "nproc_per_node", "preset", "steps", "global_batch", "warmup_steps", "interval", "extra_args")
        }
        math["math_args"] = list(math_args)
        return math_key(math)


def math_key(math: dict) -> str:
    """Hash of what decides a run's final weights: ``math`` (its settings, as JSON) and the training code that
    computes them (every room's modules and the presets; not the launcher's, nor :data:`_NOT_MATH`)."""
    h = hashlib.sha256(json.dumps(math, sort_keys=True).encode())
    training = REPO / "training"
    # every room (training/*/), not only the top level: the model, data, checkpoint and job code live there
    for f in sorted(training.rglob("*.py")) + sorted((training / "presets").glob("*.toml")):
        if f.name not in _NOT_MATH and "launch" not in f.relative_to(training).parts:
            h.update(str(f.relative_to(training)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _lcm(a: int, b: int) -> int:
    from math import gcd

    return a * b // gcd(a, b)

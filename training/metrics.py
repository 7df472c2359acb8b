"""Rank-0 progress lines and per-step metrics as JSONL (appended across restarts)."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from training.config import MetricsConfig


class MetricsLogger:
    """Writes one JSON object per line with an "event" field; does nothing on ranks other than 0."""

    def __init__(self, cfg: MetricsConfig, *, rank: int, total_steps: int):
        self.cfg, self.enabled, self.total_steps = cfg, rank == 0, total_steps
        self._f = None
        self._step_times: list[float] = []
        if self.enabled:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.path)), exist_ok=True)
            self._f = open(cfg.path, "a", buffering=1)

    def event(self, event: str, **fields: Any) -> None:
        if self._f:
            self._f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    def step(self, **m: Any) -> None:
        if not self.enabled:
            return
        self.event("step", **m)
        self._step_times = (self._step_times + [m["step_time_s"]])[-20:]
        if m["step"] % self.cfg.log_every == 0 or m["step"] == self.total_steps:
            eta = sorted(self._step_times)[len(self._step_times) // 2] * (self.total_steps - m["step"])
            self._say(f"step {m['step']:>6}/{self.total_steps} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | "
                      f"{m['tokens_per_s']:,.0f} tok/s | {m['step_time_s']:.2f} s/step | "
                      f"ckpt {m['ckpt_block_s']:.2f} s | world {m['world_size']} | ETA {eta:,.0f} s")

    def info(self, msg: str) -> None:
        if self.enabled:
            self._say(msg)

    @staticmethod
    def _say(line: str) -> None:
        try:
            print(line, flush=True)
        except BrokenPipeError:
            # Whoever read our output is gone (a launcher killed with SIGKILL, `| head`): the console is best
            # effort, the JSONL file and the checkpoints are not, and a stop must not turn into a crash here.
            # Later output goes to /dev/null (as the Python docs advise: no error at exit either).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None

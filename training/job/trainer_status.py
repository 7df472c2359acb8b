"""Progress into ``TrainJob.status.trainerStatus`` (Kubeflow Trainer's ``TrainJobStatus`` feature), off the
training thread.

Where the Trainer controller runs with that feature gate, it gives the training containers
``KUBEFLOW_TRAINER_SERVER_URL`` (the HTTPS endpoint of this TrainJob's status), ``KUBEFLOW_TRAINER_SERVER_CA_CERT``
(a file: the CA of that endpoint) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a file: a projected service-account token
that rotates, so it is read again for every request). Rank 0 then POSTs, at most every :data:`INTERVAL_S` (as
the Trainer asks) and once more at the end of an attempt::

    {"trainerStatus": {"progressPercentage": 42, "estimatedRemainingSeconds": 3600,
                       "metrics": [{"name": "loss", "value": "2.31"}, ...], "lastUpdatedTime": "...Z"}}

with the step, loss, tokens/s, world size, failures so far, goodput so far and the last failure's cost (the goodput
ledger of the run's records, :mod:`training.goodput.ledger`, refreshed once a minute: it reads every record). Older
Trainer versions named the variables ``KUBEFLOW_TRAINER_STATUS_*``; they are read too.

    board = TrainerStatus.build(cfg.metrics, enabled=rank == 0, total_steps=...)   # a NullLog without the URL
    board.record(rec); board.close()

A report that fails (the endpoint down, a token refused) is said once per kind of error and never stops
training; the JSONL file stays the record of truth.
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import threading
import time
from collections import deque
from typing import Any, Mapping

from training.config import MetricsConfig
from training.goodput.analysis import load_records
from training.goodput.ledger import LedgerError, ledger_from_records
from training.job.tensorboard import NullLog

INTERVAL_S = 5.0
TIMEOUT_S = 5.0
LEDGER_EVERY_S = 60.0
RECENT = 20  # steps the ETA's pace is taken over
PREFIXES = ("KUBEFLOW_TRAINER_SERVER_", "KUBEFLOW_TRAINER_STATUS_")


def endpoint(env: Mapping[str, str]) -> tuple[str, str | None, str | None] | None:
    """(url, CA file, token file) from the controller's variables, None where it gave none."""
    for prefix in PREFIXES:
        if env.get(prefix + "URL"):
            return env[prefix + "URL"], env.get(prefix + "CA_CERT") or None, env.get(prefix + "TOKEN") or None
    return None


class TrainerStatus:
    """Posts the run's progress to the TrainJob's status endpoint from its own thread (see the module doc)."""

    def __init__(
        self,
        url: str,
        ca_file: str | None,
        token_file: str | None,
        *,
        metrics_path: str,
        total_steps: int,
        interval_s: float = INTERVAL_S,
    ):
        self.url, self.ca_file, self.token_file = url, ca_file, token_file
        self.metrics_path, self.total_steps, self.interval_s = metrics_path, total_steps, interval_s
        self._earlier: list[dict] = []  # the run's records before this attempt (read from metrics.path)
        self._mine: list[dict] = []  # this attempt's
        self._last_step: dict | None = None
        self._step_times: deque[float] = deque(maxlen=RECENT + 1)  # wall times of this attempt's newest steps
        self._lock = threading.Lock()
        self._new = threading.Event()  # a record arrived since the last report
        self._stop = threading.Event()
        self._errors: set[str] = set()
        self._ledger: tuple[float, dict[str, Any]] = (float("-inf"), {})  # (when, its figures)
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="trainer-status", daemon=True)
        self._thread.start()

    @classmethod
    def build(
        cls, cfg: MetricsConfig, *, enabled: bool, total_steps: int, env: Mapping[str, str] | None = None
    ) -> "TrainerStatus | NullLog":
        """The reporter of rank 0 (``enabled``) where the controller gave an endpoint, else a NullLog."""
        where = endpoint(os.environ if env is None else env)
        if not enabled or where is None:
            return NullLog()
        return cls(*where, metrics_path=cfg.path, total_steps=total_steps)

    def record(self, rec: dict[str, Any]) -> None:
        """Take one metrics record (any thread; never waits on the network)."""
        with self._lock:
            self._mine.append(rec)
            if rec.get("event") == "step":
                self._last_step = rec
                self._step_times.append(rec["time"])
        self._new.set()

    def close(self) -> None:
        """Post the last state (bounded wait) and stop."""
        self._stop.set()
        self._new.set()
        self._thread.join(2 * TIMEOUT_S + 1)

    # ---- the reporting thread
    def _run(self) -> None:
        self._new.wait()
        with self._lock:
            first = self._mine[0]["time"] if self._mine else float("inf")
        self._earlier = [r for r in load_records(self.metrics_path) if r.get("time", first) < first]
        last = float("-inf")
        while not self._stop.is_set():
            if not self._new.wait(self.interval_s):
                continue  # nothing new to say
            if self._stop.wait(max(0.0, last + self.interval_s - time.monotonic())):
                break  # closing: the final report below
            self._new.clear()
            if self._post():
                last = time.monotonic()
        self._post(final=True)

    def _ledger_figures(self, final: bool) -> dict[str, Any]:
        """Failures and goodput from the goodput ledger of the whole run: once a minute (it reads every record,
        on the host's CPU) and for the final report."""
        when, figures = self._ledger
        if not final and time.monotonic() - when < LEDGER_EVERY_S:
            return figures
        with self._lock:
            records = self._earlier + self._mine
        try:
            ledger = ledger_from_records("", records, self.total_steps)
        except LedgerError:
            return figures
        figures = {"failures": len(ledger.failures), "goodput": round(ledger.goodput, 4)}
        if ledger.failures:
            f = ledger.failures[-1]
            figures.update(last_failure_step=f.step, last_failure_cost_s=f.cost_s, last_failure=f.how[:100])
        self._ledger = (time.monotonic(), figures)
        return figures

    def payload(self, final: bool = False) -> dict[str, Any] | None:
        """The ``trainerStatus`` body (None before this attempt's first step)."""
        with self._lock:
            step, times = self._last_step, list(self._step_times)
        if step is None:
            return None
        left = self.total_steps - step["step"]
        metrics = {
            "step": step["step"],
            "world_size": step.get("world_size"),
            "loss": step.get("loss"),
            "tokens_per_s": step.get("tokens_per_s"),
            **self._ledger_figures(final),
        }
        status = {
            "progressPercentage": int(100 * step["step"] / self.total_steps) if self.total_steps else 0,
            "metrics": [{"name": k, "value": str(v)} for k, v in metrics.items() if v is not None],
            "lastUpdatedTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        gaps = [b - a for a, b in zip(times[1:], times[2:])]  # the attempt's first step (warm-up) left out
        if gaps and left >= 0:
            status["estimatedRemainingSeconds"] = int(statistics.median(gaps) * left)
        return {"trainerStatus": status}

    def _post(self, final: bool = False) -> bool:
        """Send the status (False: nothing to say yet, before this attempt's first step)."""
        import requests  # here, on this thread: nothing of it on the training thread

        body = self.payload(final)
        if body is None:
            return False
        headers = {}
        try:
            if self.token_file:
                with open(self.token_file) as f:  # rotates: read again every time
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            r = requests.post(self.url, json=body, headers=headers, verify=self.ca_file or True, timeout=TIMEOUT_S)
            if r.status_code >= 300:
                self._say(f"HTTP {r.status_code}", f"{r.status_code} {r.text[:200].strip()}")
            else:
                self.posted += 1
        except (OSError, requests.RequestException) as e:
            self._say(type(e).__name__, str(e)[:200])
        return True

    def _say(self, kind: str, detail: str) -> None:
        if kind not in self._errors:
            self._errors.add(kind)
            _say_once(
                f"TrainJob status report to {self.url} failed ({detail}); training continues, reports go on being tried"
            )


def _say_once(line: str) -> None:
    try:
        print(f"WARNING: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass

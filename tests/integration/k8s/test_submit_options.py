"""`make train PLATFORM=eks` (scripts/train_eks.sh -> python -m tools.k8s.submit): a wait option that cannot work
is one `error:` line naming the value and the fix, exit 2, in the dry run too (no YAML printed) and before a real
submit looks for a cluster."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT

ENV = {
    k: v
    for k, v in os.environ.items()
    if k
    not in (
        "PLATFORM",
        "DRY_RUN",
        "ARGS",
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
        "NODES",
        "NPROC",
        "SPARES",
        "PRESET",
        "IMAGE",
        "IMAGE_TAG",
    )
}
TIMEOUT = (
    "error: argument --timeout: '-5' is not a number of seconds >= 0: give how long to wait for the job, "
    "e.g. 7200, or 0 to wait without limit"
)
POLL = "error: argument --poll: '0' is not a number of seconds > 0: give the pause between status checks, e.g. 5"


def train_eks(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scripts/train.sh", *args],
        cwd=ROOT,
        env={**ENV, "PLATFORM": "eks", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (("--timeout", "-5", "--poll", "0"), TIMEOUT),
        (("--poll", "0"), POLL),
        (("--poll", "-1"), POLL.replace("'0'", "'-1'")),
        (("--timeout", "soon"), TIMEOUT.replace("'-5'", "'soon'")),
        (("--timeout", "nan"), TIMEOUT.replace("'-5'", "'nan'")),
    ],
)
def test_a_negative_timeout_or_a_poll_without_pause_is_refused_in_the_dry_run(args, line) -> None:
    # It was accepted (YAML, exit 0); a submit then said "timed out after -5 s" at its first poll, polling nonstop.
    r = train_eks(*args, DRY_RUN="1")
    assert (r.returncode, r.stderr, r.stdout) == (2, line + "\n", ""), r.stdout[-500:] + r.stderr


def test_a_real_submit_refuses_them_before_it_looks_for_a_cluster(tmp_path) -> None:
    r = train_eks("--timeout", "-5", KUBECONFIG=str(tmp_path / "no-kubeconfig"))
    assert (r.returncode, r.stderr, r.stdout) == (2, TIMEOUT + "\n", ""), r.stdout + r.stderr


def test_zero_timeout_waits_without_limit_and_a_fractional_poll_is_fine() -> None:
    r = train_eks("--timeout", "0", "--poll", "0.2", DRY_RUN="1")
    assert r.returncode == 0 and "kind: TrainJob" in r.stdout, r.stderr

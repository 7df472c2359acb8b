"""Shared test helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import file_order, session_once

ROOT = Path(__file__).resolve().parents[1]

# `make test ARGS=...` hands its command-line variables to everything below it (the environment, and MAKEFLAGS for
# a make), and the Makefile exports the scripts' variables: a test's own `make status` then got the suite's ARGS
# (`--durations=60` as a training option). A script or make that a test runs sees only what the test gives it.
MAKE_VARIABLES = (
    "MAKEFLAGS",
    "MFLAGS",
    "MAKEOVERRIDES",
    "MAKELEVEL",
    "ARGS",
    "PLATFORM",
    "PRESET",
    "NPROC",
    "NODES",
    "SPARES",
    "MAX_RESTARTS",
    "SOAK",
    "DRY_RUN",
    "IMAGE_TAG",
)
for _name in MAKE_VARIABLES:
    os.environ.pop(_name, None)
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

# A model small enough that end-to-end tests take seconds per run on 2 cores.
TINY = [
    "--model.d_model",
    "64",
    "--model.d_kv",
    "16",
    "--model.d_ff",
    "128",
    "--model.num_layers",
    "2",
    "--model.num_decoder_layers",
    "2",
    "--model.num_heads",
    "4",
    "--data.seq_len",
    "64",
    "--train.global_batch",
    "4",
    "--train.warmup_steps",
    "2",
    "--parallel.threads",
    "1",
    # Most end-to-end tests are about the storage tier (what a resume after a kill loads); the in-memory
    # tier (on by default) is turned on by its own tests (tests/e2e/training/test_memory_tier_e2e.py, chaos).
    "--checkpoint.memory_interval",
    "0",
]


def torchrun(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`torchrun --standalone -m training` with `args` through the agent `make train` uses
    (training.launch.agent: the job's exit code, not torchrun's 1); returns the completed process (text output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch.agent",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "training",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A real local 3-member etcd (TLS, authentication on) for the test module; every file that tests membership
    on etcd gets its own, as each defined it before."""
    from training.launch.rendezvous.members import LocalEtcd

    with LocalEtcd.start(str(tmp_path_factory.mktemp("etcd"))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment with no cluster and no credentials: PATH without Slurm's commands, no kubeconfig, no AWS
    credentials or instance metadata, a scratch shared directory, no local Slurm lab (the make variables' tests,
    in two tiers)."""
    tmp = tmp_path_factory.mktemp("env-flags")
    bindir = tmp / "bin"
    bindir.mkdir()
    slurm = {"sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "salloc", "sacct"}
    for d in os.environ["PATH"].split(os.pathsep):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name not in slurm and not (bindir / name).exists():
                    (bindir / name).symlink_to(os.path.join(d, name))
    (tmp / "not-a-dir").write_text("")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "SLURM_", "KUBE")) and k not in ("DRY_RUN", "NODES", "NPROC", "PRESET")
    }
    env.update(
        PATH=str(bindir),
        KUBECONFIG=str(tmp / "no-kubeconfig"),
        SHARED_DIR=str(tmp / "shared"),
        SLAB_ROOT=str(tmp / "no-lab"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-credentials"),
        AWS_CONFIG_FILE=str(tmp / "no-config"),
        AWS_EC2_METADATA_DISABLED="true",
        OUT_FILE=str(tmp / "not-a-dir"),
    )
    (tmp / "shared").mkdir()
    return env


TINY_STEPS = 8

# For a killed run whose resume must come from the storage checkpoint of step 3 (a kill after step 5): synchronous
# saves, so that checkpoint has committed before the kill on a loaded machine too. An async save can still be in
# flight two steps later (seen in CI); its commit then rightly never happens. The saved state is the same either
# way, so the resumed run and the reference keep async saves.
STEP_3_COMMITTED = ("--checkpoint.async_save", "false")


def tiny_run(out: Path, nproc: int = 2, *extra: str, steps: int = TINY_STEPS) -> subprocess.CompletedProcess:
    """The tiny model for `steps` steps with a checkpoint every 3 (and at the end) in `out`."""
    return torchrun(
        nproc, *TINY, "--job.out_dir", str(out), "--train.steps", str(steps), "--checkpoint.interval", "3", *extra
    )


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory) -> Path:
    """One uninterrupted 2-rank run of `tiny_run`, shared by the end-to-end tests that compare against it: made once
    per session, not once per xdist worker (8 files on any of the workers use it; tests/support/session_once.py).
    Tests copy from it and never write into it."""

    def make(out: Path) -> None:
        r = tiny_run(out)
        assert r.returncode == 0, r.stdout + r.stderr

    return session_once.made_once(session_once.session_root(tmp_path_factory), "tiny_reference", make)


def mount_tmpfs(where: Path, options: str) -> None:
    """A real tmpfs at `where` (root only; skips elsewhere, saying why)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (this checks the real file-system path)")
    where.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]).returncode:
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN)")


@pytest.fixture
def tmpfs(tmp_path):
    """make(name, mount options) -> a tmpfs mounted at tmp_path/name, unmounted after the test."""
    mounted = []

    def make(name: str, options: str) -> Path:
        where = tmp_path / name
        mount_tmpfs(where, options)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)])


# The suite's tiers are its top folders; a test's tier marker comes from where it lives, so `-m unit` selects what
# `pytest tests/unit` runs (scripts/test.sh runs the tiers by folder). A test outside a tier would run in `make test`
# but in no tier's target, and a test marked with another tier than its folder's would be selected by both: either
# stops the run, naming the files.
TIERS = ("unit", "integration", "e2e")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m, which must see these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    outside, misplaced = set(), set()
    for item in items:
        parts = item.path.resolve().relative_to(here).parts if item.path.resolve().is_relative_to(here) else ()
        tier = parts[0] if len(parts) > 1 else None
        if tier not in TIERS:
            outside.add(str(item.path))
            continue
        other = {m.name for m in item.iter_markers() if m.name in TIERS} - {tier}
        if other:
            misplaced.add(f"{item.nodeid} (marked {', '.join(sorted(other))})")
        item.add_marker(tier)
    problems = [f"not in a tier's folder (tests/unit, tests/integration, tests/e2e): {p}" for p in sorted(outside)]
    problems += [f"marked with another tier than its folder's: {p}" for p in sorted(misplaced)]
    if problems:
        raise pytest.UsageError("\n".join(problems))
    _longest_files_first(items)


def _rel(path) -> str:
    return Path(path).resolve().relative_to(ROOT).as_posix()


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Files in the order pytest-xdist should hand them out (tests/support/file_order.py); a file's tests keep
    their order. Every worker sorts alike: xdist requires the same collection everywhere."""
    seconds = file_order.load_seconds()
    files = list(dict.fromkeys(_rel(item.path) for item in items))
    weight = {f: file_order.expected_seconds(f, f.split("/")[1], seconds) for f in files}
    rank = {f: i for i, f in enumerate(file_order.longest_first(files, weight))}
    items.sort(key=lambda item: rank[_rel(item.path)])


# Every run ends with one line per tier (scripts/test.sh runs the tiers in one pytest run, so pytest-xdist keeps
# both workers busy across them): what passed and failed, and the seconds its tests took, setup and teardown
# included, summed over the workers (a tier's share of the run; the tiers overlap in wall time).
_TIER_STATS: dict[str, dict] = {}


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = Path(report.fspath).parts
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None
    if tier is None:
        return
    _FILE_SECONDS[report.fspath] = _FILE_SECONDS.get(report.fspath, 0.0) + report.duration
    stats = _TIER_STATS.setdefault(tier, {"seconds": 0.0, "outcomes": {}})
    stats["seconds"] += report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = (
            "xfailed"
            if hasattr(report, "wasxfail") and report.skipped
            else "xpassed"
            if hasattr(report, "wasxfail")
            else "error"
            if report.when == "setup" and report.failed
            else report.outcome
        )
        stats["outcomes"][outcome] = stats["outcomes"].get(outcome, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _TIER_STATS:
        return
    terminalreporter.section("time per tier")
    for tier in TIERS:
        if tier in _TIER_STATS:
            stats = _TIER_STATS[tier]
            counts = ", ".join(f"{n} {what}" for what, n in sorted(stats["outcomes"].items()))
            terminalreporter.write_line(f"tier {tier}: {counts} in {stats['seconds']:.1f} s of test time")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With T5_FILE_SECONDS=PATH, the seconds each file took go into that table (file_order.py reads
    tests/file_seconds.json). Only the controller writes: xdist workers see their own share."""
    out = os.environ.get("T5_FILE_SECONDS")
    if out and not hasattr(session.config, "workerinput") and _FILE_SECONDS:
        path = Path(out)
        path.write_text(json.dumps(file_order.merged(file_order.load_seconds(path), _FILE_SECONDS), indent=1) + "\n")

"""Nothing a user owns is lost or silently mixed (torchrun, gloo, CPU): foreign directories survive retention,
damaged checkpoints are detected and set aside, a resume with other settings stops, a diverged run keeps its
good checkpoints, and a failing file system is reported at once with its reason."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, TINY_STEPS, tiny_run
from training.checkpoint import MARKER, QUARANTINE, latest_complete, read_marker, step_dir, verify
from training.compare import compare

pytestmark = pytest.mark.e2e
STEPS = TINY_STEPS


def run(out: Path, *extra: str, steps: int = STEPS):
    return tiny_run(out, 2, *extra, steps=steps)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tiny_reference):
    return tiny_reference


def copy_run(reference: Path, dest: Path) -> Path:
    shutil.copytree(reference / "checkpoints", dest / "checkpoints")
    return dest / "checkpoints"


def test_foreign_step_directories_survive_retention(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for name in ("step_1", "step_2"):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "model.bin").write_bytes(b"the user's own weights")
    r = run(tmp_path, "--checkpoint.interval", "1", "--checkpoint.keep_last", "1", steps=5)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("step_1", "step_2"):
        assert (ckpts / name / "model.bin").read_bytes() == b"the user's own weights"
    out = r.stdout + r.stderr
    assert out.count("holds entries this job did not write (step_1, step_2)") == 1
    assert sorted(p.name for p in ckpts.glob("step_0*")) == ["step_00000005"]  # our own are still pruned


def test_flipped_bytes_are_detected_and_the_previous_checkpoint_used(reference, tmp_path):
    ckpts = copy_run(reference, tmp_path)
    shard = sorted(step_dir(ckpts, STEPS).glob("*.distcp"))[-1]
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    shard.write_bytes(data)
    assert verify(step_dir(ckpts, STEPS))[0]  # same size: only the checksum can tell
    r = run(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"{shard} fails its checksum" in out and "resumed from step 6" in out
    # set aside for inspection, not deleted; the rerun's own step 8 equals the reference
    aside = list((ckpts / QUARANTINE).glob(f"step_{STEPS:08d}.*"))
    assert len(aside) == 1 and (aside[0] / shard.name).read_bytes() == bytes(data)
    assert "fails its checksum" in (aside[0] / "QUARANTINED.txt").read_text()
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(ckpts, STEPS)) == []


def test_shard_of_random_bytes_without_checksums_falls_back_instead_of_crash_looping(reference, tmp_path):
    """A marker of the earlier format (sizes only) cannot catch this by checksum: DCP's CheckpointException
    (a BaseException) must still mean "use the previous checkpoint"."""
    ckpts = copy_run(reference, tmp_path)
    newest = step_dir(ckpts, STEPS)
    info = read_marker(newest)
    info["files"] = {n: v["size"] for n, v in info["files"].items()}
    info.pop("format")
    (newest / MARKER).write_text(json.dumps(info))
    shard = sorted(newest.glob("*.distcp"))[0]
    shard.write_bytes(os.urandom(shard.stat().st_size))
    r = run(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "could not be loaded" in out and "resumed from step 6" in out and "Traceback" not in out
    assert len(list((ckpts / QUARANTINE).iterdir())) == 1


def test_resume_with_other_settings_stops_and_names_them_then_accepting_applies_them(reference, tmp_path):
    ckpts = copy_run(reference, tmp_path)
    data = tmp_path / "other.jsonl"
    data.write_text("".join(json.dumps({"text": f"another corpus, line {i}. " * 20}) + "\n" for i in range(200)))
    r = run(tmp_path, "--train.lr", "0.01", "--data.source", str(data))
    assert r.returncode == 4, r.stdout + r.stderr
    err = r.stderr
    assert "train.lr: 0.001 -> 0.01" in err and "data.source: builtin (content" in err and str(data) in err
    accept = [ln.split()[-1] for ln in err.splitlines() if ln.strip().startswith("--checkpoint.accept_changes")]
    assert accept and set(accept[0].split(",")) == {"train.lr", "data.source"} and "Nothing was loaded" in err
    assert err.count("belongs to a run with other settings") == 1  # rank 0 speaks for the job
    assert sorted(p.name for p in ckpts.iterdir()) == sorted(p.name for p in (reference / "checkpoints").iterdir())
    # Accepting the new peak lr: the next step runs on the same curve, scaled by 10.
    r = run(tmp_path, "--train.lr", "0.01", "--checkpoint.accept_changes", "train.lr,train.steps", steps=10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "accepted change train.lr: 0.001 -> 0.01" in r.stdout
    start = [x for x in records(tmp_path) if x["event"] == "start"][-1]
    assert start["resumed_from"] == STEPS and start["accepted_changes"] == ["train.lr", "train.steps"]
    steps = {x["step"]: x for x in records(tmp_path) if x["event"] == "step"}
    ref_lr = {x["step"]: x["lr"] for x in records(reference) if x["event"] == "step"}
    assert steps[9]["lr"] > 5 * ref_lr[STEPS]  # the learning rate really changed


def test_diverged_run_exits_nonzero_and_keeps_its_good_checkpoints(tmp_path):
    r = run(tmp_path, "--fault.nan_at_step", "5")
    assert r.returncode == 5, r.stdout + r.stderr
    assert r.stderr.count("non-finite loss nan") == 1 and "step 5" in r.stderr
    ckpts = tmp_path / "checkpoints"
    assert latest_complete(ckpts).name == "step_00000003" and sorted(p.name for p in ckpts.glob("step_*")) == [
        "step_00000003"
    ]
    assert not any(x["event"] == "end" and x.get("step") == STEPS for x in records(tmp_path))


def in_private_tmpfs(mountpoint: Path, size: str, *argv: str, ro: bool = False) -> subprocess.CompletedProcess:
    """Run argv with a small tmpfs at `mountpoint`, in a private mount namespace (gone when the run ends)."""
    opts = f"size={size}" + (",ro" if ro else "")
    script = f'mount -t tmpfs -o {opts} tmpfs "$0" && exec "$@"'
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(mountpoint), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def tiny_argv(out: Path, ckpts: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.launch.agent",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "training",
        *TINY,
        "--job.out_dir",
        str(out),
        "--checkpoint.dir",
        str(ckpts),
        "--train.steps",
        str(STEPS),
        "--checkpoint.interval",
        "3",
        *extra,
    ]


def test_full_file_system_stops_the_run_with_the_reason_and_keeps_the_previous_checkpoint(tmp_path):
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    # One checkpoint of the tiny model is ~3.7 MB: the first fits in 6 MB, the second does not.
    r = in_private_tmpfs(
        ckpts,
        "6m",
        "sh",
        "-c",
        '"$@"; rc=$?; ls -R "$0" > "$0.ls"; for d in "$0"/step_*; do cp -r "$d" "$0.kept"; done; exit $rc',
        str(ckpts),
        *tiny_argv(tmp_path, ckpts),
    )
    out = r.stdout + r.stderr
    assert r.returncode == 6, out
    assert "the checkpoint of step 6 could not be written" in r.stderr and "no space left on the device" in r.stderr
    assert "step_00000003" in r.stderr and "is intact" in r.stderr
    steps = [x["step"] for x in records(tmp_path) if x["event"] == "step"]
    # the failed save is agreed at the next step boundary (7, or 8 when the write fails late): never a finished run
    ends = [x for x in records(tmp_path) if x["event"] == "end"]
    assert max(steps) <= 8 and ends and all(x["status"] == "error" for x in ends), ends
    kept = Path(f"{ckpts}.kept")
    assert kept.name == "ckpts.kept" and verify(kept)[0] and read_marker(kept)["step"] == 3


def test_unwritable_checkpoint_directory_is_refused_before_training(tmp_path):
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    r = in_private_tmpfs(ckpts, "6m", *tiny_argv(tmp_path, ckpts), ro=True)
    assert r.returncode == 2, r.stdout + r.stderr  # a location to fix, found at start (README: exit 2)
    assert f"checkpoint.dir={str(ckpts)!r} is not writable: read-only file system" in r.stderr
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # refused by the agent's check: no worker started


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_inside_another_runs_checkpoint_is_refused_and_nothing_changes(reference, tmp_path):
    """Issue 29: --checkpoint.dir inside another run's committed step_00000006 used to be accepted with a generic
    warning; the outer run's retention then deleted it with the inner run's checkpoints."""
    outer = copy_run(reference, tmp_path / "outer")
    before = tree(tmp_path)
    inner = step_dir(outer, 6) / "inner"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            *TINY,
            "--job.out_dir",
            str(tmp_path / "inner-run"),
            "--checkpoint.dir",
            str(inner),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
    assert "is inside step_00000006, a checkpoint of the run in" in r.stderr and "keep_last" in r.stderr
    assert tree(tmp_path) == before and not (tmp_path / "inner-run").exists()


def test_a_commit_marker_without_its_step_is_quarantined_not_a_crash(reference, tmp_path):
    """Issue 29: a COMMITTED.json without 'step' was a KeyError in every rank; it is a damaged checkpoint."""
    ckpts = copy_run(reference, tmp_path)
    marker = step_dir(ckpts, STEPS) / MARKER
    info = json.loads(marker.read_text())
    del info["step"]
    marker.write_text(json.dumps(info))
    r = run(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "KeyError" not in out, out
    assert f"{marker} lacks step" in out and "resumed from step 6" in out
    assert len(list((ckpts / QUARANTINE).glob(f"step_{STEPS:08d}.*"))) == 1
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(ckpts, STEPS)) == []

"""Bad inputs to the checkpoint tools (training.compare, training.export) and to --model.init_from: one line that
names the input and what is wrong with it, exit 2 (3 for weights of another model shape), never a traceback and
never a damaged checkpoint compared as if it were sound."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import ROOT
from training import compare as compare_cli
from training import export as export_cli
from training.checkpoint.storage import StorageTier, step_dir
from training.config import CheckpointConfig, ModelConfig
from training.model.t5 import build_model, model_signature

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.training.test_tools_inputs import SMALL


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """A checkpoint.dir with one real checkpoint (step 2) of a small model and an optimizer entry, written by the
    job's own StorageTier (commit marker with every file's size and CRC32C)."""
    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    root.mkdir()  # the job makes it in its start checks
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        cfg = ModelConfig(**SMALL)
        model = build_model(cfg, seed=0)
        state = {"train": {"model": model.state_dict(), "optim": {"step": torch.tensor(2.0)}}}
        mgr = StorageTier(
            CheckpointConfig(dir=str(root), async_save=False), rank=0, world_size=1, signature=model_signature(cfg)
        )
        mgr.save(2, state, force=True)
        mgr.close()
    finally:
        dist.destroy_process_group()
    return root


def run(cli, *args: str, capsys) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def flip_a_byte(ckpt: Path) -> Path:
    """Damage the largest data file of `ckpt` in place, keeping its size (only the checksum can tell)."""
    data = max(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) - 100] ^= 0x01  # tensor bytes near the end: the file still loads, with one value changed
    data.write_bytes(bytes(raw))
    return data


# ---- case 1: compare --atol ------------------------------------------------------------------------------------
@pytest.mark.parametrize("atol", ["-1", "nan", "abc"])
def test_compare_refuses_a_bad_atol_in_one_line(checkpoints, capsys, atol):
    ckpt = step_dir(checkpoints, 2)
    code, out, err = run(compare_cli, ckpt, ckpt, "--atol", atol, capsys=capsys)
    line = one_error_line(err)
    assert code == 2 and f"--atol {atol}" in line and ">= 0" in line and out == ""


def test_compare_takes_a_tolerance_and_a_checkpoint_dir(checkpoints, capsys):
    code, out, _ = run(compare_cli, step_dir(checkpoints, 2), checkpoints, "--atol", "1e-6", capsys=capsys)
    assert code == 0 and out.startswith("EQUAL:") and "within 1e-6" in out


# ---- case 2: a checkpoint that fails its checksum --------------------------------------------------------------
def test_compare_verifies_checksums_like_export_and_names_the_file(checkpoints, tmp_path, capsys):
    good = step_dir(checkpoints, 2)
    bad = tmp_path / good.name
    shutil.copytree(good, bad)
    damaged = flip_a_byte(bad)
    code, out, err = run(compare_cli, good, bad, capsys=capsys)
    line = one_error_line(err)
    assert code == 2 and out == "" and f"file {damaged} fails its checksum" in line
    with pytest.raises(ValueError, match="fails its checksum"):
        compare_cli.compare(bad, good)
    # export refuses the same checkpoint with the same finding (one check, shared)
    code, _, err = run(export_cli, bad, tmp_path / "hf", capsys=capsys)
    assert code == 2 and f"file {damaged} fails its checksum" in one_error_line(err)
    assert not (tmp_path / "hf").exists()


# ---- case 3: a path that is not a training checkpoint ----------------------------------------------------------
@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "hf"
    export_cli.export(checkpoints, out)
    return out


@pytest.mark.parametrize("cli, extra", [(compare_cli, "CKPT"), (export_cli, "OUT")])
def test_a_missing_path_is_named_as_missing(checkpoints, tmp_path, capsys, cli, extra):
    missing = tmp_path / "nope"
    other = step_dir(checkpoints, 2) if extra == "CKPT" else tmp_path / "out"
    code, _, err = run(cli, missing, other, capsys=capsys)
    line = one_error_line(err)
    assert code == 2 and f"{missing} does not exist" in line and "commit marker" not in line


@pytest.mark.parametrize(
    "cli, use, extra", [(compare_cli, "compare checkpoints", "CKPT"), (export_cli, "export a checkpoint", "OUT")]
)
def test_a_hugging_face_directory_is_named_as_one(checkpoints, exported, tmp_path, capsys, cli, use, extra):
    other = step_dir(checkpoints, 2) if extra == "CKPT" else tmp_path / "out"
    code, _, err = run(cli, exported, other, capsys=capsys)
    line = one_error_line(err)
    assert code == 2 and "commit marker" not in line
    assert (
        f"{exported} is a Hugging Face model directory (config.json + model.safetensors), not a training "
        f"checkpoint; {use} (a step_NNNNNNNN directory or a checkpoint.dir)"
    ) in line


def test_an_unfinished_save_still_says_so(checkpoints, tmp_path, capsys):
    unfinished = tmp_path / "step_00000004"
    shutil.copytree(step_dir(checkpoints, 2), unfinished)
    (unfinished / "COMMITTED.json").unlink()
    code, _, err = run(compare_cli, unfinished, step_dir(checkpoints, 2), capsys=capsys)
    assert code == 2 and "no commit marker (the save did not finish)" in one_error_line(err)


# ---- round 4, case 5: an export to a path that cannot become its new directory ---------------------------------
def export_in_a_process(ckpt: Path, out: Path | str) -> tuple[int, str]:
    """The real entry point in its own process: its exit code and its stderr (stdout empty, no traceback)."""
    r = subprocess.run(
        [sys.executable, "-m", "training.export", str(ckpt), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.stdout == "" and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r.returncode, r.stderr


def test_an_export_onto_a_file_or_under_one_is_one_line_and_touches_nothing(checkpoints, tmp_path):
    """Before: a bare '[Errno 20] Not a directory'. The file stays as it was and nothing is made."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert export_in_a_process(checkpoints, afile) == (
        2,
        f"error: {afile} is a file, not a directory; choose a new directory for the export (nothing was overwritten)\n",
    )
    for under in (afile / "hf", afile / "a" / "hf"):
        assert export_in_a_process(checkpoints, under) == (
            2,
            f"error: cannot create {under}: {afile} is a file, not a directory; choose a new directory elsewhere\n",
        )
    assert afile.read_text() == "keep me" and list(tmp_path.iterdir()) == [afile]


def test_an_export_where_no_directory_can_be_made_is_one_line(checkpoints):
    """Before: a bare '[Errno 2] No such file or directory' (mkdir in /proc says ENOENT, its parent there)."""
    code, err = export_in_a_process(checkpoints, "/proc/t5-export")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: cannot create /proc/t5-export: ") and err.endswith(
        "; choose a new directory on a writable file system\n"
    ), err
    assert not Path("/proc/t5-export").exists()


@pytest.mark.parametrize("there", [False, True], ids=["new-dir", "empty-dir"])
def test_an_export_that_runs_out_of_room_leaves_nothing_half_written(checkpoints, tmpfs, there):
    """A real 4 KiB tmpfs (root only: skips elsewhere): the weights do not fit. Before: '[Errno 28] ...' and a
    directory holding part of the export, which looks like a model."""
    small = tmpfs("small", "size=4k")
    out = small / "hf"
    if there:
        out.mkdir()
    assert export_in_a_process(checkpoints, out) == (
        2,
        f"error: cannot write {out}: No space left on device; choose a writable directory with room (nothing "
        "was left there)\n",
    )
    assert [p.name for p in small.rglob("*")] == (["hf"] if there else [])

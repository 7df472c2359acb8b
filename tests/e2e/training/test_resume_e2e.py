"""End to end under torchrun (gloo, CPU): exact resume after SIGKILL, resharding, bad checkpoints."""

import json
import re
import shutil
import socket
from pathlib import Path

import pytest
import torch

from tests.conftest import STEP_3_COMMITTED, TINY, TINY_STEPS, tiny_run, torchrun
from training.checkpoint import latest_complete, step_dir
from training.compare import compare

pytestmark = pytest.mark.e2e
STEPS = TINY_STEPS
run = tiny_run


def effective_steps(metrics: Path) -> dict[int, dict]:
    """The last record of each step: what the final weights actually descend from."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r for r in recs if r["event"] == "step"}


@pytest.fixture(scope="module")
def reference(tiny_reference):
    return tiny_reference


@pytest.fixture(scope="module")
def reference_no_dropout(tmp_path_factory):
    """Dropout masks depend on how samples are split over ranks, so a world-size change can only match
    an uninterrupted run within tolerance when dropout is off."""
    out = tmp_path_factory.mktemp("ref_nodrop")
    r = run(out, 2, "--model.dropout", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_a_peer_silent_in_the_final_save_costs_the_bounded_wait_then_resume_is_exact(reference, tmp_path):
    # Rank 1 stops (SIGSTOP: its sockets stay open, as a silent node's) as the final checkpoint (step 8) starts.
    # Rank 0's checkpoint collectives give up after the bound set from the timed saves (at least
    # checkpoint.min_timeout_s = 5 s), not checkpoint.timeout_s (1 h; the helper's 240 s limit would fail the
    # test): the worker ends as one that lost a peer, not as a storage failure (exit 6), and a rerun resumes.
    r = run(
        tmp_path, 2, "--fault.stop_in_save_at_step", str(STEPS), "--fault.rank", "1", "--checkpoint.min_timeout_s", "5"
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"rank 1 stops itself (SIGSTOP) in the checkpoint save of step {STEPS}" in out, out
    assert "checkpoint collectives now wait at most" in out, out
    assert f"the checkpoint of step {STEPS} was not completed: a peer did not answer in time" in out, out
    assert "exit code 6" not in out, out
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000006"
    r = run(tmp_path)
    assert r.returncode == 0 and "resumed from step 6" in r.stdout, r.stdout + r.stderr
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(tmp_path / "checkpoints", STEPS)) == []


def test_a_hung_worker_is_killed_by_its_nodes_watchdog_then_resume_is_exact(reference, tmp_path):
    # Rank 1 stops (SIGSTOP) after step 5: alive, sockets open, silent. Its agent's node watchdog sees its
    # heartbeat file unchanged for parallel.heartbeat_timeout_s and SIGKILLs it (no 30 s stop wait); rank 0
    # does not wait in its next collective for train_timeout_s (60 s here). A rerun resumes from step 3.
    r = run(
        tmp_path,
        2,
        *STEP_3_COMMITTED,
        "--fault.stop_at_step",
        "5",
        "--fault.rank",
        "1",
        "--parallel.heartbeat_timeout_s",
        "5",
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "rank 1 stops itself (SIGSTOP) after step 5" in out, out
    pid = int((tmp_path / ".fault-stop-step5").read_text())
    assert re.search(
        rf"\[agent\] worker pid {pid} \(rank 1\) has sent no heartbeat for [0-9.]+ s "
        r"\(parallel.heartbeat_timeout_s 5\): SIGKILLed it",
        out,
    ), out
    assert "Timed out waiting" not in out, out  # no collective timeout was needed
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000003"
    r = run(tmp_path)
    assert r.returncode == 0 and "resumed from step 3" in r.stdout, r.stdout + r.stderr
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(tmp_path / "checkpoints", STEPS)) == []


def test_sigkill_then_resume_is_bitwise_exact(reference, tmp_path):
    # Rank 1 is SIGKILLed after step 5, while the step-3 checkpoint is the newest complete one (step 6 never
    # reached): steps 4-5 are recomputed.
    r = run(tmp_path, 2, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "1")
    assert r.returncode != 0 and "SIGKILL" in r.stdout + r.stderr
    assert latest_complete(tmp_path / "checkpoints").name == "step_00000003"
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from step 3" in r.stdout
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(tmp_path / "checkpoints", STEPS)) == []
    # and a rerun of a finished job says so and exits 0
    r = run(tmp_path)
    assert r.returncode == 0 and "already finished" in r.stdout


def assert_reload_at_world1_is_lossless(saved: Path, resave_root: Path, monkeypatch):
    """Load a 2-rank checkpoint in a 1-rank process group and save it again: bitwise the same state."""
    from training.config import load_config
    from training.job.trainer import Trainer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    cfg = load_config(
        [
            *TINY,
            "--model.dropout",
            "0",
            "--train.steps",
            str(STEPS),
            "--job.out_dir",
            str(saved.parent.parent),
            "--metrics.path",
            str(resave_root / "m.jsonl"),
        ]
    )
    torch.manual_seed(1234)
    untouched = torch.get_rng_state()
    trainer = Trainer(cfg)
    try:
        assert trainer.world == 1 and trainer._resume() == 6
        # The restore filled every weight (the resave below is bitwise the checkpoint): the seed's initial weights
        # were never drawn, which reseeds and advances the CPU generator (18 s of a t5-large start on a GPU host)
        assert torch.equal(torch.get_rng_state(), untouched), "the initial weights were drawn, then overwritten"
        trainer.ckpt.storage.root = resave_root
        trainer.ckpt.storage.save(6, trainer.state, force=True, sync=True)
    finally:
        trainer.close()
    assert compare(saved, step_dir(resave_root, 6)) == []


@pytest.mark.parametrize(
    "micro_batch, per_rank", [("0", "4 per rank)"), ("2", "4 per rank in 2 micro-batches of <= 2)")]
)
def test_reshard_world2_to_world1_every_sample_once(reference_no_dropout, tmp_path, monkeypatch, micro_batch, per_rank):
    """The survivor of a 2-rank job takes the whole global batch; with train.micro_batch it does so in
    micro-batches no larger than each rank's share was before (what bounds GPU memory after a node loss)."""
    reference = reference_no_dropout
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(step_dir(reference / "checkpoints", 6), step_dir(ckpts, 6))
    if micro_batch == "0":
        assert_reload_at_world1_is_lossless(step_dir(ckpts, 6), tmp_path / "resaved", monkeypatch)
    r = run(tmp_path, 1, "--checkpoint.interval", "1", "--model.dropout", "0", "--train.micro_batch", micro_batch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "saved at world size 2, now 1" in r.stdout
    assert f"global batch 4 ({per_rank}" in r.stdout
    # Only the reduction order differs from the uninterrupted 2-rank run: equal within fp tolerance.
    assert compare(step_dir(reference / "checkpoints", STEPS), step_dir(ckpts, STEPS), atol=1e-4) == []
    steps = effective_steps(tmp_path / "metrics.jsonl")
    assert sorted(steps) == [7, 8]
    assert [steps[s]["data_offset"] for s in (7, 8)] == [6 * 4, 7 * 4]  # continues exactly where 2 ranks stopped
    assert {steps[s]["world_size"] for s in steps} == {1}


def test_micro_batches_accumulate_the_same_gradient_and_resume_bitwise(reference_no_dropout, tmp_path):
    """Two micro-batches of 1 per rank: the same training as whole batches (within fp tolerance), and a SIGKILL +
    resume in that mode is bitwise equal to its own uninterrupted run."""
    micro = ("--model.dropout", "0", "--train.micro_batch", "1")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run(straight, 2, *micro)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global batch 4 (2 per rank in 2 micro-batches of <= 1)" in r.stdout
    final = step_dir(straight / "checkpoints", STEPS)
    assert compare(step_dir(reference_no_dropout / "checkpoints", STEPS), final, atol=1e-5) == []
    r = run(killed, 2, *micro, *STEP_3_COMMITTED, "--fault.sigkill_at_step", "5", "--fault.rank", "0")
    assert r.returncode != 0 and "SIGKILL" in r.stdout + r.stderr
    r = run(killed, 2, *micro)
    assert r.returncode == 0 and "resumed from step 3" in r.stdout, r.stdout + r.stderr
    assert compare(final, step_dir(killed / "checkpoints", STEPS)) == []


def test_checkpoint_of_another_model_is_refused(reference, tmp_path):
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    r = torchrun(2, *TINY, "--model.d_model", "96", "--job.out_dir", str(tmp_path), "--train.steps", "12")
    assert r.returncode != 0
    assert "was written for model" in r.stderr and "'d_model': 64" in r.stderr and "'d_model': 96" in r.stderr
    # nothing was overwritten
    assert latest_complete(tmp_path / "checkpoints").name == f"step_{STEPS:08d}"


def test_truncated_newest_checkpoint_falls_back_with_warning(reference, tmp_path):
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    newest = step_dir(tmp_path / "checkpoints", STEPS)
    shard = sorted(newest.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"WARNING: checkpoint {newest} is damaged" in out and "truncated" in out and "resumed from step 6" in out
    assert len(list((tmp_path / "checkpoints" / "quarantine").iterdir())) == 1  # set aside, not deleted
    assert compare(step_dir(reference / "checkpoints", STEPS), newest) == []


def test_checkpoint_corrupt_in_content_falls_back(reference, tmp_path):
    """Same size but garbage bytes: the loader fails, warns and uses the previous checkpoint."""
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    newest = step_dir(tmp_path / "checkpoints", STEPS)
    meta = newest / ".metadata"
    meta.write_bytes(b"\0" * meta.stat().st_size)
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{meta} fails its checksum" in r.stdout + r.stderr and "resumed from step 6" in r.stdout

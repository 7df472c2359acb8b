"""The checks before any process starts (training.job.check): each kind of bad data, location and device is
one message naming the value and the fix, from every start path (agent, launcher, python -m training, Slurm
submit), with the exit code of the README's table and no worker started."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import TINY
from training.job import check as job_check
from training.config import ConfigError, load_config
from training.data.corpus import DataSourceError
from training.data.dataset import build_dataset
from training.job.check import check_data, check_device, check_inputs, check_job, check_locations

TEXT = "The quick brown fox jumps over the lazy dog, and keeps running for a while. " * 4


def data_cfg(source: Path | str, *extra: str):
    return load_config([*TINY, "--data.source", str(source), *extra])


def jsonl(path: Path, n: int, field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: f"{i}: {TEXT}"}) + "\n" for i in range(n)))
    return path


def test_a_good_corpus_passes_and_its_token_count_is_what_training_reads(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    jsonl(src / "a.jsonl", 20)
    pq.write_table(pa.table({"text": [f"{i}: {TEXT}" for i in range(10)]}), src / "b.parquet")
    cfg = data_cfg(src)
    facts = check_data(cfg.data, min_samples=cfg.train.global_batch)
    assert facts.files == 2 and facts.documents == 30 and facts.complete
    assert facts.tokens == len(build_dataset(cfg.data, seed=0).tokens)  # the same stream training builds


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("empty.jsonl", "", "holds no documents (an empty file)"),
        ("blank.jsonl", "\n\n  \n", "holds no documents (an empty file)"),
        ("bad.jsonl", '{"text": "fine"}\n{"text": broken\n', "bad.jsonl:2 is not JSON (Expecting value at column 10)"),
        ("list.jsonl", '["a", "b"]\n', "list.jsonl:1 is a JSON list, not an object"),
        (
            "field.jsonl",
            '{"body": "x", "id": 1}\n',
            "field.jsonl:1 has no field 'text' (its fields: body, id); set --data.text_field",
        ),
        ("notes.txt", "plain text\n", "is neither .jsonl nor .parquet"),
    ],
)
def test_each_bad_jsonl_is_named_with_its_line_and_fix(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataSourceError) as e:
        check_data(data_cfg(path).data, min_samples=4)
    assert needle in str(e.value)


def test_non_utf8_text_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataSourceError, match=r"latin1.jsonl:2 is not UTF-8 text"):
        check_data(data_cfg(path).data, min_samples=1)


def test_a_lone_surrogate_escape_names_the_line(tmp_path):
    # Valid JSON whose string is not text: it would crash the byte tokenizer with a bare UnicodeEncodeError.
    path = tmp_path / "escaped.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "half a pair \\ud800 here"}\n')
    with pytest.raises(
        DataSourceError,
        match=r"escaped.jsonl:2 field 'text' holds a lone surrogate \(U\+D800 at "
        r"character 12\).*fix or drop that escape",
    ):
        check_data(data_cfg(path).data, min_samples=1)


def test_parquet_without_the_column_and_a_file_that_is_not_parquet(tmp_path):
    pq.write_table(pa.table({"content": [TEXT] * 10}), tmp_path / "wrong.parquet")
    with pytest.raises(DataSourceError, match=r"has no column 'text' \(its columns: content\); set --data.text_field"):
        check_data(data_cfg(tmp_path / "wrong.parquet").data, min_samples=1)
    cfg = data_cfg(tmp_path / "wrong.parquet", "--data.text_field", "content")
    assert check_data(cfg.data, min_samples=1).documents == 10
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(DataSourceError, match="is not a readable parquet file"):
        check_data(data_cfg(tmp_path / "fake.parquet").data, min_samples=1)


def test_missing_source_and_a_directory_without_data(tmp_path):
    with pytest.raises(DataSourceError, match=r"data.source='.*nope.jsonl' does not exist; pass a .jsonl file"):
        check_data(data_cfg(tmp_path / "nope.jsonl").data, min_samples=1)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "readme.md").write_text("hi")
    with pytest.raises(DataSourceError, match="is a directory with no .jsonl or .parquet files in it"):
        check_data(data_cfg(tmp_path / "d").data, min_samples=1)


def test_too_few_tokens_for_one_global_batch_says_how_many_are_needed(tmp_path):
    path = jsonl(tmp_path / "small.jsonl", 3)  # ~3 x 330 bytes; a tiny-config sample is 70 tokens
    cfg = data_cfg(path, "--train.global_batch", "64")
    with pytest.raises(DataSourceError) as e:
        check_data(cfg.data, min_samples=cfg.train.global_batch)
    tokens = len(build_dataset(cfg.data, seed=0).tokens)
    assert f"holds {tokens:,} tokens" in str(e.value) and "train.global_batch=64 needs 4,480 tokens" in str(e.value)
    assert check_data(cfg.data, min_samples=4).tokens == tokens  # four samples fit


def test_a_large_corpus_is_checked_at_its_head(tmp_path, monkeypatch):
    path = jsonl(tmp_path / "big.jsonl", 1500)
    with path.open("a") as f:
        f.write("not json at the end\n")
    cfg = data_cfg(path)
    with pytest.raises(DataSourceError, match="big.jsonl:1501 is not JSON"):  # small enough: read completely
        check_data(cfg.data, min_samples=4)
    monkeypatch.setattr(job_check, "FULL_SCAN_BYTES", 1000)
    said = []
    monkeypatch.setattr(job_check, "PROGRESS_BYTES", 1000)
    facts = check_data(cfg.data, min_samples=4, say=said.append)
    assert not facts.complete and facts.documents == job_check.HEAD_RECORDS
    assert said and "the first 1000 records of each" in said[0]


def test_locations_that_are_files_or_cannot_be_created(tmp_path):
    (tmp_path / "afile").write_text("x")
    ok = dict(
        out_dir=str(tmp_path / "run"),
        checkpoint_dir=str(tmp_path / "run/ckpt"),
        metrics_path=str(tmp_path / "run/m.jsonl"),
    )
    check_locations(**ok)
    assert not (tmp_path / "run").exists()  # a check creates nothing
    cases = [
        (dict(out_dir=str(tmp_path / "afile")), "job.out_dir='%s/afile' is a file, not a directory"),
        (
            dict(checkpoint_dir=str(tmp_path / "afile/sub")),
            "checkpoint.dir='%s/afile/sub' cannot be created: %s/afile is a file",
        ),
        (dict(metrics_path=str(tmp_path)), "metrics.path='%s' is a directory; pass a file path"),
    ]
    for change, needle in cases:
        with pytest.raises(ConfigError) as e:
            check_locations(**{**ok, **change})
        assert needle.replace("%s", str(tmp_path)) in str(e.value)


def test_weights_to_start_from_must_be_local_directories(tmp_path):
    with pytest.raises(ConfigError, match="model.init_from='google/t5-small' is not a local directory"):
        check_inputs(init_from="google/t5-small", initial_load_path="")
    with pytest.raises(ConfigError, match="checkpoint.initial_load_path=.* is not a directory"):
        check_inputs(init_from="", initial_load_path=str(tmp_path / "none"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: the CPU-only message cannot appear")
def test_a_gpu_preset_on_a_machine_without_gpus():
    cfg = load_config(["--preset", "t5-small"])
    with pytest.raises(ConfigError) as e:
        check_device(cfg.parallel, preset=cfg.preset)
    assert "preset 't5-small' trains on CUDA GPUs" in str(e.value) and "--preset debug" in str(e.value)
    check_device(load_config(["--preset", "debug"]).parallel, preset="debug")  # CPU presets need nothing
    with pytest.raises(ConfigError):
        check_job(cfg, files=False)
    check_job(cfg, files=False, device=False)  # a submit host: nothing of the job is checked here


@pytest.fixture
def empty(tmp_path) -> list[str]:
    (tmp_path / "empty.jsonl").write_text("")
    return ["--data.source", str(tmp_path / "empty.jsonl"), "--job.out_dir", str(tmp_path / "run")]


# ---- issue 29: locations that pass a look but cannot be written, and checkpoint directories inside each other
def test_a_metrics_path_that_is_a_device_is_refused(tmp_path):
    ok = dict(out_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "run/ckpt"))
    with pytest.raises(
        ConfigError,
        match=r"metrics.path='/dev/full' is a character device, not a regular file; "
        r"pass a file path \(--metrics.path DIR/metrics.jsonl\)",
    ):
        check_locations(**ok, metrics_path="/dev/full")


def make_checkpoint_root(root: Path, steps=(3, 6)) -> None:
    """A checkpoint.dir as a run leaves it (ownership files, lineage), with data to checksum."""
    root.mkdir(parents=True)
    (root / ".t5-failover-lineage").write_text("0123abcd")
    for s in steps:
        d = root / f"step_{s:08d}"
        d.mkdir()
        (d / ".t5-failover").write_text(json.dumps({"step": s}))
        (d / "__0_0.distcp").write_bytes(os.urandom(2048))


def digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("inner", ["step_00000006/inner", "step_00000006", "quarantine/x", "sub/deeper"])
def test_a_checkpoint_dir_inside_another_runs_checkpoints_is_refused(tmp_path, inner):
    outer = tmp_path / "a" / "checkpoints"
    make_checkpoint_root(outer)
    before = digest(tmp_path)
    kw = dict(out_dir=str(tmp_path / "b"), metrics_path=str(tmp_path / "b/m.jsonl"))
    with pytest.raises(ConfigError) as e:
        check_locations(**kw, checkpoint_dir=str(outer / inner))
    msg = str(e.value)
    if inner.startswith("step_"):
        assert "step_00000006, a checkpoint of the run in" in msg and "keep_last" in msg, msg
    else:
        assert f"is inside {outer}, the checkpoint.dir of another run" in msg, msg
    assert "--checkpoint.dir" in msg and "nothing was changed" in msg
    assert digest(tmp_path) == before


def test_a_checkpoint_dir_around_another_runs_is_refused(tmp_path):
    make_checkpoint_root(tmp_path / "runs" / "a" / "checkpoints")
    before = digest(tmp_path)
    with pytest.raises(ConfigError, match=r"holds another run's checkpoint.dir .*runs/a/checkpoints"):
        check_locations(
            out_dir=str(tmp_path / "x"), metrics_path=str(tmp_path / "x/m"), checkpoint_dir=str(tmp_path / "runs")
        )
    assert digest(tmp_path) == before
    # side by side is fine, and so is the run's own directory (a resume)
    for ok in (tmp_path / "runs" / "b" / "checkpoints", tmp_path / "runs" / "a" / "checkpoints"):
        check_locations(out_dir=str(tmp_path / "x"), metrics_path=str(tmp_path / "x/m"), checkpoint_dir=str(ok))


def test_init_from_is_checked_before_any_process_starts(tmp_path):
    """The pretrained directory's check (training.model.pretrained) runs in the start checks: one line, exit 2 or 3."""
    from training.errors import CheckpointIncompatible

    empty, other = tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    other.mkdir()
    (other / "config.json").write_text(
        json.dumps(
            {
                "d_model": 32,
                "d_kv": 16,
                "d_ff": 128,
                "num_layers": 2,
                "num_decoder_layers": 2,
                "num_heads": 4,
                "vocab_size": 384,
                "feed_forward_proj": "gated-gelu",
            }
        )
    )
    (other / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="has neither config.json nor weights"):
        check_job(load_config([*TINY, "--model.init_from", str(empty)]), device=False)
    with pytest.raises(CheckpointIncompatible, match="holds a model of another shape: d_model=32"):
        check_job(load_config([*TINY, "--model.init_from", str(other)]), device=False)

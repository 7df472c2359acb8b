"""A prepared shard damaged after prepare, read mid-training by one rank only: the job stops with that rank's one-line
message (the shard, the offset, the fix) and exit code 2, not a peer's traceback from a collective it lost."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY, torchrun
from training.config import DataConfig, JobConfig
from training.data.dataset import GlobalOrder, build_dataset, prepare


@pytest.mark.e2e
def test_a_damaged_token_read_by_one_rank_stops_every_rank_with_its_one_line(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(
        "".join(
            json.dumps({"text": f"Document {i}: " + "the quick brown fox. " * (5 + i % 11)}) + "\n" for i in range(12)
        )
    )
    dst = tmp_path / "prepared"
    prepare(str(src), str(dst), shard_tokens=1000)
    ds = build_dataset(DataConfig(source=str(dst), seq_len=64), seed=JobConfig().seed)
    order = GlobalOrder(len(ds), JobConfig().seed)
    (_, first_of_rank_1), _ = order.rank_samples(0, 4, rank=1, world=2)  # TINY: global batch 4, 2 ranks
    assert first_of_rank_1 not in [i for _, i in order.rank_samples(0, 4, rank=0, world=2)]
    token = first_of_rank_1 * ds.raw_len + 10
    damaged = int(ds.tokens[token : token + 1]) - 2**15  # a byte id with its high bit flipped
    shard, at = divmod(token, 1000)
    name = dst / f"tokens-{shard:05d}.bin"
    with open(name, "r+b") as f:  # the high bit of one token flipped: the start's checks (sizes) still pass
        f.seek(at * 2 + 1)
        high = f.read(1)[0]
        f.seek(at * 2 + 1)
        f.write(bytes([high ^ 0x80]))
    r = torchrun(2, *TINY, "--job.out_dir", str(tmp_path / "out"), "--train.steps", "2", "--data.source", str(dst))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2, r.stdout + r.stderr
    assert errors == [
        f"error: shard {name} at token {at:,} (byte {2 * at:,}) holds token id "
        f"{damaged}, which no token stream holds "
        f"(only 1 and 3..258; the vocabulary has 384): the shard was damaged after prepare; check the "
        f"directory with `python -m training.data verify {dst}`, then re-run `python -m training.data "
        f"prepare SRC {dst}` (or copy the prepared directory again, completely)"
    ], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and "IndexError" not in r.stderr

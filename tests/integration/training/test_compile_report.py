"""training.compile_report: graph breaks of the T5 blocks and recompiles across steps are counted and reported; for
the GPU presets' kernel ('eager') each block is one graph and nothing recompiles after the first step."""

from __future__ import annotations

import json

from training import compile_report

TINY = ["--model.d_model", "32", "--model.d_kv", "8", "--model.d_ff", "64", "--model.num_heads", "4"]
TINY += ["--model.num_layers", "2", "--model.num_decoder_layers", "2", "--data.seq_len", "24"]


def test_a_tiny_t5_compiles_whole_blocks_and_never_recompiles(capsys, tmp_path):
    out = tmp_path / "report.json"
    argv = ["--preset", "debug", "--backend", "eager", "--steps", "2", "--batch", "1", "--out", str(out), "--", *TINY]
    assert compile_report.main(argv) == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert (report["attention"], report["backend"], report["steps"]) == ("sdpa", "eager", 2)
    assert sorted(report["blocks"]) == ["decoder.block.0", "decoder.block.1", "encoder.block.0", "encoder.block.1"]
    assert all(b == {"graphs": 1, "graph_breaks": 0, "reasons": []} for b in report["blocks"].values())
    assert report["graph_breaks"] == 0
    # first and later block of each stack (position bias computed or handed on): 4 graphs, then none new
    assert (report["graphs_first_step"], report["recompiles_after_first_step"]) == (4, 0)

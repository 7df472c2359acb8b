"""What torch.compile makes of the model (issue 51, lever 2): graph breaks per T5 block, and recompiles across steps.

    python -m training.compile_report --preset t5-large -- --model.attention flex          # on a GPU
    python -m training.compile_report --preset debug --backend eager -- --model.attention sdpa_bias   # CPU, quick

* **graph breaks**: ``torch._dynamo.explain`` of the first two blocks of each stack (the first computes the position
  bias, the others reuse it), called with the inputs the model's own forward hands them; 0 means the block is one
  graph, so the compiler can fuse its norms, gated GELU and residuals whole;
* **recompiles**: every block compiled in place as ``parallel.compile on`` does (training.model.compile), then
  ``--steps`` training steps (forward, loss, backward) on fresh token batches of the run's shapes; graphs compiled
  after the first step are recompiles (0 is the target: a recompile is a compile paid again mid-run).

The model is built whole on the device (no FSDP, one process); with ``parallel.precision bf16`` on a GPU, bf16
autocast stands in for FSDP's bf16 parameters (a few casts more in the graphs, the same breaks). Prints one JSON
object (and writes it to ``--out`` if given). ``--backend eager`` traces with Dynamo only: the same
graphs, breaks and guards, no code generation (seconds instead of minutes on a CPU). On the CPU the 'flex' kernel
trains through a reference that Dynamo does not trace (training/model/flex.py), so each of its self-attention calls
is a break there; the count that matters is the GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

BLOCKS_EXPLAINED = 2  # per stack: block 0 (computes the position bias) and block 1 (reuses it)


def block_inputs(model, inputs: dict) -> dict[str, tuple[tuple, dict]]:
    """The (args, kwargs) each explained block receives in one forward of ``model`` on ``inputs`` (no grad)."""
    seen: dict[str, tuple[tuple, dict]] = {}
    hooks = []
    for stack in ("encoder", "decoder"):
        for i, block in enumerate(getattr(model, stack).block[:BLOCKS_EXPLAINED]):

            def keep(_module, args, kwargs, name=f"{stack}.block.{i}"):
                seen.setdefault(name, (args, dict(kwargs)))

            hooks.append(block.register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs, use_cache=False)  # training never decodes: no key/value cache in the blocks' inputs
    finally:
        for h in hooks:
            h.remove()
    return seen


def graph_breaks(model, inputs: dict) -> dict[str, dict]:
    """Per explained block: Dynamo's graph count, graph-break count and the breaks' reasons (grad enabled, as in
    training)."""
    from training.torch_private import dynamo_explain

    report = {}
    for name, (args, kwargs) in block_inputs(model, inputs).items():
        block = model.get_submodule(name)
        graphs, breaks, reasons = dynamo_explain(block, *args, **kwargs)
        report[name] = {"graphs": graphs, "graph_breaks": breaks, "reasons": sorted(set(reasons))}
    return report


def recompiles(model, batches: list[dict], *, backend: str) -> dict[str, int]:
    """Compile every block in place, run one training step per batch; the graphs of the first step and those
    compiled after it."""
    from training.model.compile import apply_regional_compile
    from training.torch_private import dynamo_graphs_compiled

    torch.compiler.reset()
    apply_regional_compile(model, True, backend=backend)
    before = dynamo_graphs_compiled()  # the process's count so far (explain's graphs among them)
    counts = []
    for inputs in batches:
        labels = inputs["labels"]
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1)).backward()
        model.zero_grad(set_to_none=True)
        counts.append(dynamo_graphs_compiled())
    return {"graphs_first_step": counts[0] - before, "recompiles_after_first_step": counts[-1] - counts[0]}


def make_batches(model, *, n: int, batch: int, seq_len: int, target_len: int, device, seed: int) -> list[dict]:
    """``n`` batches as the trainer feeds them: token ids, an all-ones attention mask, labels and the decoder
    inputs shifted from them (random tokens: the graphs depend on shapes, not on the text)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    out = []
    for _ in range(n):
        ids = torch.randint(3, vocab, (batch, seq_len), generator=g)
        labels = torch.randint(3, vocab, (batch, target_len), generator=g)
        out.append(
            {
                "input_ids": ids.to(device),
                "attention_mask": torch.ones_like(ids).to(device),
                "decoder_input_ids": model._shift_right(labels).to(device),
                "labels": labels.to(device),
            }
        )
    return out


def report(cfg, *, steps: int, backend: str, batch: int) -> dict:
    """Graph breaks and recompiles of the model ``cfg`` (a training Config) describes."""
    from training.data.corpus import raw_length_for
    from training.model.t5 import apply_activation_checkpointing, build_model

    device = torch.device("cuda" if torch.cuda.is_available() and cfg.parallel.device != "cpu" else "cpu")
    model = build_model(cfg.model, seed=cfg.job.seed).to(device).train()
    if cfg.parallel.activation_checkpointing:
        apply_activation_checkpointing(model)
    target_len = raw_length_for(cfg.data.seq_len, cfg.data.noise_density, cfg.data.mean_span_len)[1]
    batches = make_batches(
        model,
        n=max(steps, 1),
        batch=batch,
        seq_len=cfg.data.seq_len,
        target_len=target_len,
        device=device,
        seed=cfg.job.seed,
    )
    bf16 = cfg.parallel.precision == "bf16" and device.type == "cuda"
    with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        breaks = graph_breaks(model, {k: v for k, v in batches[0].items() if k != "labels"})
        compiled = recompiles(model, batches, backend=backend)
    return {
        "preset": cfg.preset,
        "attention": cfg.model.attention,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "backend": backend,
        "steps": len(batches),
        "graph_breaks": sum(b["graph_breaks"] for b in breaks.values()),
        "blocks": breaks,
        **compiled,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.compile_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="debug")
    ap.add_argument("--steps", type=int, default=3, help="training steps for the recompile count (>= 2)")
    ap.add_argument("--batch", type=int, default=2, help="samples per step (graphs depend on the shape only)")
    ap.add_argument("--backend", choices=("inductor", "eager"), default="inductor")
    ap.add_argument("--out", default="", help="also write the JSON here")
    ap.add_argument("extra", nargs="*", help="training overrides after --, e.g. -- --model.attention flex")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.batch < 1:
        ap.error(f"--steps {a.steps} --batch {a.batch}: recompiles need --steps >= 2 and --batch >= 1")
    from training.config import load_config

    cfg = load_config(["--preset", a.preset, *a.extra])
    torch.set_num_threads(cfg.parallel.threads)
    result = report(cfg, steps=a.steps, backend=a.backend, batch=a.batch)
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

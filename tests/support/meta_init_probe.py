"""Run under torchrun: build the model on the meta device, shard it (FSDP2, activation checkpointing as the
trainer applies it), materialise each rank's shards, and compare the gathered weights with a CPU build.
Writes <out_dir>/rank-N.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from training.config import ModelConfig, ParallelConfig
from training.job.lifecycle import exit_without_finalization
from training.model.meta_init import RecordedInit
from training.model.t5 import apply_activation_checkpointing, apply_fsdp, build_model, build_model_for_sharding


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    cfg = ModelConfig(**json.loads(sys.argv[1]))
    built = build_model_for_sharding(cfg, seed=11)
    model = built.model
    was_meta = all(p.is_meta for p in model.parameters())
    apply_activation_checkpointing(model)
    apply_fsdp(model, mesh, ParallelConfig())
    largest_local = max(p.to_local().numel() for p in model.parameters())
    built.materialize(model, torch.device("cpu"))
    cpu = build_model(cfg, seed=11)
    reference = cpu.state_dict()
    differ = [n for n, p in model.named_parameters() if not torch.equal(p.full_tensor(), reference[n])]
    Path(sys.argv[2], f"rank-{dist.get_rank()}.json").write_text(
        json.dumps(
            {
                "rank": dist.get_rank(),
                "recorded": isinstance(built, RecordedInit),
                "was_meta": was_meta,
                "params": len(list(model.parameters())),
                "differ": differ,
                "local_numel": sum(p.to_local().numel() for p in model.parameters()),
                "largest_local": largest_local,
                "tied": model.lm_head.weight is model.shared.weight is model.encoder.embed_tokens.weight,
                "total_numel": sum(p.numel() for p in cpu.parameters()),
            }
        )
    )
    dist.destroy_process_group()
    exit_without_finalization(0)  # a torch.distributed thread's destructor can abort a finished worker


if __name__ == "__main__":
    main()

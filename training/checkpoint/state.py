"""Everything a resume needs, as Stateful objects that torch.distributed.checkpoint saves and loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from training.checkpoint.local_shards import load_local_shards


@dataclass
class Progress:
    """Where training stands. `data_offset` is the global sample offset (see training.data)."""

    step: int = 0
    tokens_seen: int = 0
    data_offset: int = 0

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.step, self.tokens_seen, self.data_offset = (
            int(sd["step"]),
            int(sd["tokens_seen"]),
            int(sd["data_offset"]),
        )


class TrainState(Stateful):
    """Model + optimizer (sharded, resharding on load) + LR scheduler + progress."""

    def __init__(self, model, optimizer, scheduler, progress: Progress):
        self.model, self.optimizer, self.scheduler, self.progress = model, optimizer, scheduler, progress

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "progress": self.progress.state_dict(),
        }

    def load_state_dict(self, sd) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.progress.load_state_dict(sd["progress"])

    def load_local_shards(self, sd) -> str:
        """``sd`` as this rank saved it at this world size, every tensor a plain local shard (a memory snapshot):
        copied straight in (training.checkpoint.local_shards). "" when done, else why not (nothing loaded)."""
        why = load_local_shards(sd, model=self.model, optimizer=self.optimizer)
        if not why:
            self.scheduler.load_state_dict(sd["scheduler"])
            self.progress.load_state_dict(sd["progress"])
        return why


class ModelOnly(Stateful):
    """The model part of a TrainState, under the same key, to start a new run from another run's weights."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        return {"model": get_model_state_dict(self.model)}

    def load_state_dict(self, sd) -> None:
        set_model_state_dict(self.model, sd["model"])


class RngState(Stateful):
    """This rank's RNG (dropout) state. Saved under a rank-specific key: identical keys on all ranks
    would be de-duplicated into one copy."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.loaded: dict[str, torch.Tensor] | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = {"cpu": torch.get_rng_state()}
        if self.cuda:
            sd["cuda"] = torch.cuda.get_rng_state()
        return sd

    def load_state_dict(self, sd) -> None:
        self.loaded = {k: v.clone() for k, v in sd.items()}

    def apply_loaded(self) -> bool:
        """Install the loaded state (call after the data iterator exists). False if none was loaded."""
        if self.loaded is None:
            return False
        torch.set_rng_state(self.loaded["cpu"])
        if self.cuda and "cuda" in self.loaded:
            torch.cuda.set_rng_state(self.loaded["cuda"])
        return True

    @staticmethod
    def key(rank: int) -> str:
        return f"rng_rank{rank}"

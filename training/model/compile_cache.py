"""Compiled artefacts kept across restarts (``parallel.compile_cache_dir``), so a restart does not compile again.

A compiled worker's first step pays Dynamo's tracing, AOTAutograd and Inductor's code generation (on an H200 about
40 s of a 75 s start for t5-large). Two of torch's public mechanisms keep that work:

* Inductor's caches (the FX graph cache, the AOTAutograd cache, Triton's kernels) live in a directory, which this
  points at a node-local one per cache key (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``): a restart on the
  same node finds its kernels there;
* ``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts`` (the portable "mega-cache"): after its first
  step rank 0 writes them as one file into ``compile_cache_dir`` (under the job's out_dir by default, on the shared
  file system on clusters), and a start on a node whose local directory has never been filled (a replacement node,
  a new pod) loads them first.

The **cache key** (:func:`cache_key`) hashes what the compiled code depends on: the model and parallel settings,
the device kind, torch's version and the source of the model's code (this package's modules and transformers' T5),
so changed settings or code never load a stale artefact: they miss and compile afresh. Both places are named by
the key. ``compile_cache_dir = "off"``, or compiling off, gives :class:`NoCompileCache`, which does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

#: The value of parallel.compile_cache_dir that keeps no artefact.
OFF = "off"
#: Parallel settings that do not change the compiled code: the cache's own places.
_NOT_IN_KEY = ("compile_cache_dir",)
#: Written in a node-local key directory once its caches hold a compiled step (a later start needs no mega-cache).
FILLED = "filled"


def model_code_files() -> list[Path]:
    """The source files whose code is compiled: this package's modules and transformers' T5 model."""
    import transformers.models.t5.modeling_t5 as t5

    return sorted(Path(__file__).parent.glob("*.py")) + [Path(t5.__file__)]


def cache_key(model: dict, parallel: dict, device: str, torch_version: str, code: dict[str, bytes]) -> str:
    """A hex digest of everything the compiled code depends on: the model and parallel settings (dicts of the
    config slices), the device kind ('cpu', or the GPU's name), torch's version and the model code (file name ->
    contents). Any change to one of them is another key."""
    h = hashlib.sha256()
    settings = {
        "model": model,
        "parallel": {k: v for k, v in parallel.items() if k not in _NOT_IN_KEY},
        "device": device,
        "torch": torch_version,
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(code):
        h.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(code[name]).digest())
    return h.hexdigest()[:24]


def key_for(model_cfg, parallel_cfg, device: torch.device) -> str:
    """:func:`cache_key` of this job's config slices, device, torch and code files."""
    kind = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    code = {p.name: p.read_bytes() for p in model_code_files()}
    return cache_key(asdict(model_cfg), asdict(parallel_cfg), kind, torch.__version__, code)


def local_root() -> Path:
    """The node-local root of the key directories (the system's temporary directory, like Inductor's own)."""
    return Path(tempfile.gettempdir()) / "t5f-compile-cache"


class ArtifactStore:
    """The portable artefacts of one key in ``shared_dir``: ``<key>.bin``, written whole or not at all."""

    def __init__(self, shared_dir: str | Path, key: str) -> None:
        self.path = Path(shared_dir) / f"{key}.bin"

    def read(self) -> bytes | None:
        """The artefacts of this key, or None (never written: a miss)."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> bool:
        """Write the artefacts unless this key has them already; True when written."""
        if self.path.exists():
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)  # a reader sees the old state or the whole file
        return True


class NoCompileCache:
    """Compiling off, or ``compile_cache_dir = off``: nothing is kept or loaded."""

    key = None

    def open(self) -> dict | None:
        return None

    def after_first_step(self) -> None:
        return None


class CompileCache:
    """The caches of one key: the node-local Inductor directory and the shared artefacts file (see the module doc).

    ``open()`` before the first compiled call (it points Inductor at the key's directory and may load artefacts);
    ``after_first_step()`` once the first step has compiled its graphs (rank 0 publishes them, each node's first
    rank marks its directory filled)."""

    def __init__(self, key: str, shared_dir: str | Path, local_dir: Path, rank: int, local_rank: int) -> None:
        self.key = key
        self.store = ArtifactStore(shared_dir, key)
        self.local_dir = local_dir / key
        self.rank, self.local_rank = rank, local_rank
        self.loaded: str | None = None

    @staticmethod
    def build(parallel_cfg, model_cfg, device: torch.device, rank: int, local_rank: int, enabled: bool):
        """The job's compile cache, or a :class:`NoCompileCache` when not compiling or turned off."""
        if not enabled or parallel_cfg.compile_cache_dir == OFF:
            return NoCompileCache()
        key = key_for(model_cfg, parallel_cfg, device)
        return CompileCache(key, parallel_cfg.compile_cache_dir, local_root(), rank, local_rank)

    def open(self) -> dict:
        """Point torch's compile caches at this key's node-local directory; load the shared artefacts when that
        directory was never filled. Returns the ``start`` event's record: key, local hit, what was loaded."""
        (self.local_dir / "inductor").mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.local_dir / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(self.local_dir / "triton")
        local_hit = (self.local_dir / FILLED).exists()
        if not local_hit:
            data = self.store.read()
            if data is not None:
                torch.compiler.load_cache_artifacts(data)
                self.loaded = "shared"
        return {"key": self.key, "local_hit": local_hit, "loaded": self.loaded}

    def after_first_step(self) -> None:
        if self.rank == 0 and self.store.read() is None:
            saved = torch.compiler.save_cache_artifacts()
            if saved is not None:
                self.store.write(saved[0])
        if self.local_rank == 0:
            (self.local_dir / FILLED).touch()

"""Typed settings of one Slurm training job, validated with messages that name the value and the fix.

The same :class:`SlurmJobConfig` renders the batch script (:mod:`cluster_assets.slurm.render`) for AWS
ParallelCluster (checkpoints on ``/fsx``, the ECR image through pyxis) and for the local Slurm lab (a shared
directory on this machine, the project venv). GPU facts come from the infrastructure's own instance table and
the time limits from the Slurm row of the timeouts table (both in :mod:`cluster_facts`), so the job and the
cluster agree on GPUs per node, EFA and how long a stop may take.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from cluster_facts import FSX_MOUNT_PATH, GPU_INSTANCES, RDZV_STORE_PORT, SHUTDOWN_MARGIN_S, platform_timeouts
from training.field_docs import field_docs as _field_docs

REPO_DIR = Path(__file__).resolve().parents[2]
SLURM_TIMEOUTS = platform_timeouts("slurm")
# Training flags the batch script owns: they must point at shared storage, so they derive from shared_dir.
RESERVED_TRAIN_FLAGS = ("--job.out_dir", "--checkpoint.dir", "--metrics.path")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
# Slurm --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?")


class SlurmConfigError(ValueError):
    """An invalid job setting; the message names the setting, the bad value and what to use instead."""


class SharedDirError(SlurmConfigError):
    """The shared directory is missing on this host (an environment problem, not a bad value)."""


def parse_time_limit(value: str) -> int:
    """Slurm ``--time`` string -> seconds (``30`` = 30 min, ``1:30:00``, ``2-00:00:00``, ...)."""
    m = _TIME.fullmatch(value.strip())
    if not m:
        raise SlurmConfigError(f"time_limit={value!r} is not a Slurm time; use MINUTES, HH:MM:SS or D-HH:MM:SS")
    d, a, b, c = (int(x) if x is not None else None for x in m.group("d", "a", "b", "c"))
    if d is None:
        if b is None:
            return a * 60  # M
        if c is None:
            return a * 60 + b  # M:S
        return a * 3600 + b * 60 + c  # H:M:S
    return d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)  # D-H[:M[:S]]


@dataclass(frozen=True)
class SlurmJobConfig:
    """One training job on a Slurm cluster: what to run, where its state lives, how it survives failures."""

    run_name: str = ""
    """Name of the run (empty: the preset's name): job name, and the directories ``<shared_dir>/runs/<name>``
    (log, metrics, rendered script) and ``<shared_dir>/checkpoints/<name>``. Resubmitting a name resumes it."""
    preset: str = "debug"
    """Training preset (``training/presets/<name>.toml``)."""
    train_args: tuple[str, ...] = ()
    """Extra ``python -m training`` flags, e.g. ``("--train.steps", "200")``. Paths are set by the job."""

    nodes: int = 2
    """Nodes that train; one torchrun agent per node. The job always trains at this size (bitwise-reproducible
    resumes): without a spare a lost node fails the allocation and Slurm requeues the whole job."""
    spares: int = 0
    """Hot-spare nodes allocated on top of ``nodes`` (``SPARES``): their agents wait in the rendezvous while the
    job trains on ``nodes`` nodes, and take a lost node's place in the next round (torch's redundancy list).
    The allocation is ``nodes + spares`` nodes. With a spare and the store off the compute nodes
    (``rdzv_store``), the job survives a node loss inside its allocation (``sbatch --no-kill``): no requeue. The
    batch host (the allocation's first node, whose loss always ends the allocation) starts as the spare."""
    nproc_per_node: int | None = None
    """Training processes per node. Default: ``gpus_per_node``, or 1 on CPU nodes."""
    instance_type: str | None = None
    """EC2 GPU instance type of the compute nodes (e.g. ``p5.48xlarge``): sets ``gpus_per_node``, ``efa``
    and ``gpudirect_rdma`` from the infrastructure's instance table. Leave unset for CPU nodes."""
    gpus_per_node: int = 0
    """GPUs to request per node (``--gpus-per-node``); 0 = CPU job (no NCCL/EFA environment)."""
    efa: bool = False
    """Nodes have EFA: set the libfabric/NCCL environment for it (``FI_PROVIDER=efa`` ...)."""
    gpudirect_rdma: bool = False
    """EFA supports GPUDirect RDMA on these nodes (``FI_EFA_USE_DEVICE_RDMA=1``)."""

    partition: str | None = None
    """Slurm partition (ParallelCluster: the queue name). Unset = the cluster's default partition."""
    time_limit: str | None = None
    """Slurm ``--time`` (e.g. ``04:00:00``). The job checkpoints and requeues itself before it runs out."""
    signal_before_timeout_s: int = SLURM_TIMEOUTS.grace_s
    """Seconds before the time limit at which Slurm sends SIGUSR1 to the batch script (``--signal``),
    which makes training checkpoint and the job requeue itself. Must exceed ``shutdown_timeout_s`` by
    at least 30 s."""
    requeue: bool = True
    """Let Slurm requeue the job after a node failure (``--requeue``) and let it requeue itself."""
    max_requeues: int = 5
    """The batch script stops requeueing itself once the job has run this many times again."""
    requeue_on_failure: bool = True
    """When training fails for good (torchrun restarts exhausted, an agent died), requeue the job if this
    incarnation committed a newer checkpoint than it started from (progress was made; no crash loops)."""
    max_restarts: int = 3
    """torchrun worker-group restarts inside one allocation (a crashed worker costs seconds, no requeue)."""
    shutdown_timeout_s: int = SLURM_TIMEOUTS.shutdown_timeout_s
    """Seconds an agent waits for its workers to checkpoint after SIGTERM before it SIGKILLs them."""
    etcd_env: str | None = None
    """A file of ``T5_ETCD_*`` lines the batch script reads when the job starts: membership on etcd (the
    coordinator that survives losing any member). Root's credentials (``T5_ETCD_ENDPOINTS``, ``_CA``, ``_CERT``,
    ``_KEY`` and ``T5_ETCD_ROOT_PASSWORD_FILE``): the job makes its own etcd user, whose role reads and writes its
    key prefix only, and its agents get that user, never root. A job's ``job.env`` (``python -m
    training.launch.rendezvous.admin add-job``): the agents use it. Unset: ``T5_ETCD_*`` in the environment the
    job is submitted from, else the c10d store of ``rdzv_store``."""
    require_etcd: bool = True
    """Refuse to submit a job without etcd (no ``etcd_env``, no ``T5_ETCD_ENDPOINTS`` where it is submitted): such a
    job falls back to a c10d store on its first node, so losing that node requeues the whole job. ``False``
    (``--no-require-etcd``, ``REQUIRE_ETCD=0``) submits it anyway, for a cluster without etcd."""
    rdzv_store: str = "controller"
    """Without etcd (``etcd_env``, ``T5_ETCD_*``): where the c10d rendezvous store runs. ``controller``: the Slurm
    controller host (a store you run there, e.g. ``python -m training.rdzv_store``: the ParallelCluster stack runs
    none, its jobs use etcd; the address comes from ``scontrol show config``). A host name or IP: a store you run
    there. ``first-node``: the job's first node hosts it (then losing that node always requeues). A store that does
    not answer when the job starts falls back to ``first-node``, with a warning in the job log."""
    rdzv_store_port: int = RDZV_STORE_PORT
    """Port of the standalone store (``rdzv_store`` other than ``first-node``)."""
    rdzv_port: int = 29400
    """``rdzv_store=first-node`` only: base port of the store on the first node; the job uses
    ``rdzv_port + job_id % 1000``."""

    shared_dir: str = FSX_MOUNT_PATH
    """Storage every node mounts at the same path (FSx for Lustre on ParallelCluster). Checkpoints,
    metrics and the job log live here so that a requeued job resumes on any nodes."""
    repo_dir: str = str(REPO_DIR)
    """This repository as the compute nodes see it (venv mode: on shared storage)."""
    python: str = ""
    """Interpreter of the project venv as the compute nodes see it. Default ``<repo_dir>/.venv/bin/python``."""
    container_image: str | None = None
    """Container image (the stack's ECR image URI). Used through pyxis (``srun --container-image``) when the
    cluster has pyxis; otherwise the job falls back to the venv and says so."""
    container_mounts: tuple[str, ...] = ()
    """pyxis ``--container-mounts`` entries (``SRC:DST``). Default: ``shared_dir`` at the same path."""

    step_timeout_s: int | None = None
    """Upper bound for the training ``srun`` (it is wrapped in ``timeout``). Default: the time limit plus
    10 minutes, or 14 days without a time limit."""
    slurm_conf: str | None = None
    """``SLURM_CONF`` exported inside the job (the local lab's slurm.conf); unset = the cluster default."""
    extra_sbatch: tuple[str, ...] = ()
    """Additional ``#SBATCH`` options, each ``--name[=value]`` (e.g. ``--account=ml``)."""
    extra_env: tuple[str, ...] = ()
    """Additional ``NAME=value`` environment variables for training (e.g. ``NCCL_DEBUG=INFO``)."""

    # ------------------------------------------------------------------ derived
    @property
    def name(self) -> str:
        return self.run_name or self.preset

    @property
    def run_dir(self) -> str:
        return f"{self.shared_dir.rstrip('/')}/runs/{self.name}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.shared_dir.rstrip('/')}/checkpoints/{self.name}"

    @property
    def metrics_path(self) -> str:
        return f"{self.run_dir}/metrics.jsonl"

    @property
    def log_pattern(self) -> str:
        """sbatch ``--output``: one file per job id, appended to across requeues."""
        return f"{self.run_dir}/slurm-%j.out"

    @property
    def procs_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 1

    @property
    def venv_python(self) -> str:
        return self.python or f"{self.repo_dir.rstrip('/')}/.venv/bin/python"

    @property
    def mounts(self) -> tuple[str, ...]:
        return self.container_mounts or (f"{self.shared_dir}:{self.shared_dir}",)

    @property
    def srun_timeout_s(self) -> int:
        if self.step_timeout_s:
            return self.step_timeout_s
        if self.time_limit:
            return parse_time_limit(self.time_limit) + 600
        return 14 * 86400

    # ------------------------------------------------------------------ construction
    def with_instance_type(self) -> SlurmJobConfig:
        """Fill GPU/EFA facts from :attr:`instance_type` (explicit ``gpus_per_node`` wins)."""
        if not self.instance_type:
            return self
        spec = GPU_INSTANCES.get(self.instance_type)
        if spec is None:
            raise SlurmConfigError(
                f"instance_type={self.instance_type!r} is not a known GPU instance type; use one of "
                f"{', '.join(sorted(GPU_INSTANCES))}, or leave it unset and give gpus_per_node/efa yourself"
            )
        return replace(
            self,
            gpus_per_node=self.gpus_per_node or spec.gpus,
            efa=True,
            gpudirect_rdma=self.gpudirect_rdma or spec.gpudirect_rdma,
        )

    @classmethod
    def from_mapping(cls, data: dict[str, Any], origin: str = "config") -> SlurmJobConfig:
        """Build from a dict (e.g. a TOML ``[slurm]`` table); unknown keys and wrong types are errors."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise SlurmConfigError(f"unknown setting {key!r} in {origin}; valid: {', '.join(known)}")
            default = getattr(cls(), key)
            if isinstance(default, tuple):
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    raise SlurmConfigError(f"{key}={value!r} in {origin} must be a list of strings")
                value = tuple(value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise SlurmConfigError(f"{key}={value!r} in {origin} must be true or false")
            elif isinstance(default, int) or key in ("nproc_per_node", "step_timeout_s"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise SlurmConfigError(f"{key}={value!r} in {origin} must be an integer")
            elif not isinstance(value, str):
                raise SlurmConfigError(f"{key}={value!r} in {origin} must be a string")
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_toml(cls, path: str | Path) -> SlurmJobConfig:
        """Read the ``[slurm]`` table of a TOML file."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SlurmConfigError(f"cannot read job config {path}: {e}") from None
        table = data.get("slurm", data)
        if not isinstance(table, dict):
            raise SlurmConfigError(f"{path}: [slurm] must be a table")
        return cls.from_mapping(table, origin=str(path))

    # ------------------------------------------------------------------ validation
    def validate(self, *, check_paths: bool = False) -> SlurmJobConfig:
        """Raise :class:`SlurmConfigError` for the first bad setting; returns self for chaining.

        ``check_paths`` also checks that the shared directory exists and the preset file is present
        (done at submission time, on the login node, which mounts the same shared storage).
        """

        def bad(name: str, value: Any, fix: str) -> SlurmConfigError:
            return SlurmConfigError(f"{name}={value!r}: {fix}")

        if self.run_name and not _NAME.fullmatch(self.run_name):
            raise bad("run_name", self.run_name, "use 1-64 letters, digits, '.', '_' or '-' (it names directories)")
        if not _NAME.fullmatch(self.preset):
            raise bad("preset", self.preset, "use a preset name such as debug or t5-base")
        if not 1 <= self.nodes <= 4096:
            raise bad("nodes", self.nodes, "use 1 or more nodes")
        if not 0 <= self.spares <= 64:
            raise bad("spares", self.spares, "use 0 (no hot spare) .. 64 spare nodes")
        if self.nproc_per_node is not None and not 1 <= self.nproc_per_node <= 64:
            raise bad("nproc_per_node", self.nproc_per_node, "use 1..64 processes per node (or leave unset)")
        if not 0 <= self.gpus_per_node <= 64:
            raise bad("gpus_per_node", self.gpus_per_node, "use 0 (CPU) .. 64")
        if self.gpus_per_node and self.procs_per_node > self.gpus_per_node:
            raise bad(
                "nproc_per_node",
                self.nproc_per_node,
                f"more processes than the {self.gpus_per_node} GPUs per node; use at most one per GPU",
            )
        if (self.efa or self.gpudirect_rdma) and not self.gpus_per_node:
            raise bad("efa", self.efa, "EFA/NCCL settings apply to GPU nodes; set gpus_per_node or instance_type")
        if self.gpudirect_rdma and not self.efa:
            raise bad("gpudirect_rdma", self.gpudirect_rdma, "GPUDirect RDMA is an EFA feature; set efa as well")
        if self.partition is not None and not _NAME.fullmatch(self.partition):
            raise bad("partition", self.partition, "use the partition (queue) name shown by sinfo")
        if not 1 <= self.signal_before_timeout_s <= 65535:
            raise bad("signal_before_timeout_s", self.signal_before_timeout_s, "use 1..65535 seconds (Slurm's limit)")
        if self.time_limit is not None:
            limit = parse_time_limit(self.time_limit)
            if limit <= 0:
                raise bad("time_limit", self.time_limit, "use a positive time limit")
            if self.signal_before_timeout_s >= limit:
                raise SlurmConfigError(
                    f"signal_before_timeout_s={self.signal_before_timeout_s} is not shorter than "
                    f"time_limit={self.time_limit!r} ({limit} s): the job would be told to stop as soon as it "
                    f"starts; lower signal_before_timeout_s or raise time_limit"
                )
        if not 0 <= self.max_requeues <= 1000:
            raise bad("max_requeues", self.max_requeues, "use 0..1000")
        if not 0 <= self.max_restarts <= 1000:
            raise bad("max_restarts", self.max_restarts, "use 0..1000")
        if not 1 <= self.shutdown_timeout_s <= 3600:
            raise bad("shutdown_timeout_s", self.shutdown_timeout_s, "use 1..3600 seconds")
        if self.signal_before_timeout_s < self.shutdown_timeout_s + SHUTDOWN_MARGIN_S:
            raise SlurmConfigError(
                f"signal_before_timeout_s={self.signal_before_timeout_s} leaves less than {SHUTDOWN_MARGIN_S} s "
                f"beyond shutdown_timeout_s={self.shutdown_timeout_s}: the time limit could kill the job while the "
                f"agents still wait for the checkpoint; raise signal_before_timeout_s to at least "
                f"{self.shutdown_timeout_s + SHUTDOWN_MARGIN_S} or lower shutdown_timeout_s"
            )
        if self.rdzv_store not in ("controller", "first-node") and not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9.-]*", self.rdzv_store
        ):
            raise bad(
                "rdzv_store",
                self.rdzv_store,
                "use controller (the head node's store), first-node, or the "
                "host name/IP of the machine that runs `python -m training.rdzv_store`",
            )
        if not 1 <= self.rdzv_store_port <= 65535:
            raise bad("rdzv_store_port", self.rdzv_store_port, "use the store's TCP port, 1..65535")
        if not 1024 <= self.rdzv_port <= 64535:
            raise bad("rdzv_port", self.rdzv_port, "use 1024..64535 (the job adds job_id % 1000)")
        if self.step_timeout_s is not None and self.step_timeout_s < 60:
            raise bad("step_timeout_s", self.step_timeout_s, "use at least 60 seconds (or leave unset)")
        for name in ("shared_dir", "repo_dir"):
            value = getattr(self, name)
            if not value.startswith("/") or any(c.isspace() for c in value):
                raise bad(name, value, "use an absolute path without spaces, the same on every node")
        if self.python and (not self.python.startswith("/") or any(c.isspace() for c in self.python)):
            raise bad("python", self.python, "use the absolute path of the venv's python on shared storage")
        if self.etcd_env is not None and (not self.etcd_env.startswith("/") or any(c.isspace() for c in self.etcd_env)):
            raise bad(
                "etcd_env",
                self.etcd_env,
                "use the absolute path, as the batch host sees it, of a file of "
                "T5_ETCD_* lines (root's credentials, or a job's job.env)",
            )
        if self.slurm_conf is not None and not self.slurm_conf.startswith("/"):
            raise bad("slurm_conf", self.slurm_conf, "use an absolute path to slurm.conf")
        if self.container_image is not None and (
            not self.container_image or any(c.isspace() for c in self.container_image)
        ):
            raise bad(
                "container_image",
                self.container_image,
                "use an image reference such as <account>.dkr.ecr.<region>.amazonaws.com/t5-failover:0.1.0",
            )
        for m in self.container_mounts:
            if not re.fullmatch(r"/[^\s:,]*:/[^\s:,]*(:(ro|rw))?", m):
                raise bad("container_mounts", m, "use SRC:DST with absolute paths (optionally :ro)")
        for opt in self.extra_sbatch:
            if not re.fullmatch(r"--[a-z][a-z-]*(=\S+)?", opt):
                raise bad("extra_sbatch", opt, "use one --option[=value] per entry, without spaces")
        for kv in self.extra_env:
            if not _ENV.fullmatch(kv) or "\n" in kv:
                raise bad("extra_env", kv, "use NAME=value")
        for a in self.train_args:
            if "\n" in a:
                raise bad("train_args", a, "arguments must be single-line")
            flag = a.split("=", 1)[0]
            if flag in RESERVED_TRAIN_FLAGS:
                raise bad(
                    "train_args",
                    a,
                    f"{flag} is set by the job from shared_dir/run_name (checkpoints under "
                    f"{self.checkpoint_dir}); choose run_name/shared_dir instead",
                )
            if flag == "--preset":
                raise bad("train_args", a, "give the preset as the preset setting (--preset of the renderer)")
        if check_paths:
            self._check_paths()
        return self

    def _check_paths(self) -> None:
        shared = Path(self.shared_dir)
        if not shared.is_dir():
            raise SharedDirError(
                f"shared_dir={self.shared_dir!r} does not exist on this host; pass the shared file system every "
                f"node mounts (/fsx on ParallelCluster; the lab's shared dir locally: scripts/slurm_lab.sh env)"
            )
        if (
            not (Path(self.repo_dir) / "training" / "presets" / f"{self.preset}.toml").is_file()
            and self.container_image is None
        ):
            presets = sorted(p.stem for p in (Path(self.repo_dir) / "training" / "presets").glob("*.toml"))
            raise SlurmConfigError(
                f"preset={self.preset!r} not found in {self.repo_dir}/training/presets; "
                f"use one of: {', '.join(presets) or '(none: is repo_dir right?)'}"
            )


def field_docs() -> dict[str, str]:
    """Field name -> its docstring on one line (for ``--help``)."""
    return _field_docs(SlurmJobConfig)


__all__ = [
    "SlurmJobConfig",
    "SlurmConfigError",
    "SharedDirError",
    "parse_time_limit",
    "field_docs",
    "RESERVED_TRAIN_FLAGS",
]

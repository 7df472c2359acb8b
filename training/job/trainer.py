"""The training loop: FSDP2 T5 with span corruption, checkpoint resume, signals and metrics."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from training.checkpoint.host_buffers import HostBuffers
from training.checkpoint.manager import CheckpointManager
from training.config import Config, ConfigError, check_world, to_toml
from training.model.compile import apply_regional_compile, compile_enabled
from training.model.compile_cache import CompileCache, NoCompileCache
from training.data.corpus import DataSourceError
from training.data.dataset import build_dataloader, build_dataset
from training.job.determinism import apply_determinism
from training.job.check import check_device
from training.job.guard import NonFiniteGuard
from training.job.step_figures import StepFigures
from training.job.grad_clip import clip_grad_norm
from training.job.optimizer import build_adamw
from training.checkpoint.integrity import storage_reason
from training.job.faults import Faults
from training.job.metrics import MetricsLogger
from training.job.stragglers import StragglerWatch
from training.model.t5 import (
    apply_activation_checkpointing,
    apply_fsdp,
    build_model_for_sharding,
    count_params,
    model_signature,
)
from training.checkpoint.run_identity import digest_tokens, run_fingerprint, show
from training.job.startup import StartupClock
from training.checkpoint.state import ModelOnly, Progress, RngState, TrainState
from training.checkpoint.run_lock import lock_alone, lock_for_job
from training.job.progress import (
    CHECKPOINT,
    CLOSING,
    DATA,
    FINAL_CHECKPOINT,
    FORWARD_BACKWARD,
    OPTIMIZER,
    SNAPSHOT,
    ProgressTracker,
)
from training.job.failover import build as build_failover
from training.job.inplace.agreement import InPlaceFailed
from training.job.inplace.group import say
from training.job.live_state import LiveState
from training.job.prebuild import Prebuild
from training.job.recovery import RecoveryNote
from training.job.watchdog import PeerWatchdog
from training.torch_private import optimizer_step_unless

log = logging.getLogger("training")
# SIGINT (Ctrl-C) stops like SIGTERM: checkpoint at the next step boundary, exit 128+signum.
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def _ensure_env() -> None:
    """Allow a plain `python -m training` (no torchrun): a world of one on a free local port."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )


def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:  # step = optimizer steps taken so far
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def _next_batch(loader) -> tuple[dict[str, torch.Tensor] | None, str | None]:
    """(this rank's next batch, None), or (None, the message) when its data is damaged: only this rank read it."""
    try:
        return next(loader), None
    except DataSourceError as e:
        return None, str(e)


def padding_mask_or_none(host_mask: torch.Tensor) -> torch.Tensor | None:
    """The batch's attention mask (host copy), or None when it masks nothing (the trainer's packed windows).
    Decided on the host: handed an all-ones mask on the GPU, transformers checks it for padding with a
    ``.all()`` it reads back, a wait for the GPU in every forward (two per micro-batch: encoder self- and
    cross-attention). A mask of ones and no mask give bitwise the same model outputs."""
    return None if bool(host_mask.all()) else host_mask


class Trainer:
    """Builds everything from a Config; `train()` runs to `train.steps` and returns the exit code. The weights
    get their values in `train()`'s restore (or the seed's, on a fresh start); a tool that steps the model
    without `train()` calls `start_from_seed()` first."""

    def __init__(self, cfg: Config, clock: StartupClock | None = None):
        self.cfg = cfg
        self.clock = clock or StartupClock()  # main() starts it first thing, to time the imports too
        _ensure_env()
        p = cfg.parallel
        torch.set_num_threads(p.threads)
        apply_determinism(p.deterministic)  # before any CUDA kernel
        use_cuda = p.device == "cuda" or (p.device == "auto" and torch.cuda.is_available())
        check_device(p, preset=cfg.preset)  # normally done before the workers started (training.job.check)
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if use_cuda:
            torch.cuda.set_device(self.local_rank)
            torch.cuda.init()  # CUDA's start-up here, where the clock can name it, not inside the first kernel
            self.device = torch.device("cuda", self.local_rank)
            backend = "cpu:gloo,cuda:nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        self.clock.mark("device_init")
        # failover.in_place: the group forms through the job's etcd, and a lost peer is recovered in this process
        self.failover = build_failover(cfg, backend=backend)
        # failover.in_place: the model's meta build overlaps the wait for the group (a replacement's, mostly)
        prebuilt = self._prebuild() if self.failover.overlaps_group else None
        self.failover.join(timeout=timedelta(seconds=p.init_timeout_s))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.clock.mark("process_group")  # waits for every rank of the new group
        check_world(cfg, self.world)
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        self.metrics = self.watchdog = None
        self._build_group_parts()
        self.clock.mark("job_setup")  # metrics, watchdog, mesh; the rest of the set-up follows the model

        compiled = compile_enabled(p.compile)
        self.clock.compiled = compiled
        # before the first compiled call: Inductor's caches point at this key's directory, artefacts may load
        self.compile_cache = CompileCache.build(
            p, cfg.model, self.device, rank=self.rank, local_rank=self.local_rank, enabled=compiled
        )
        try:
            self.compile_cache_record = self.compile_cache.open()
        except OSError as e:  # a cache that cannot be read costs this start its compile, never the run
            self.metrics.info(
                f"[compile] compile cache unusable ({storage_reason(e)}): compiling afresh; point "
                "--parallel.compile_cache_dir at a readable directory, or 'off'"
            )
            self.compile_cache, self.compile_cache_record = NoCompileCache(), None
        self._build_model(prebuilt)
        self.clock.mark("model_build")
        # One run per checkpoint.dir; half the start-up timeout for a lost previous incarnation's lock, since
        # the other ranks wait in a collective meanwhile. Taken at the job's first start (a joiner's rank 0 holds it).
        self.run_lock = self.failover.first_start(
            lambda: lock_for_job(cfg.checkpoint.dir, self.rank, wait_same_run_s=p.init_timeout_s / 2)
        )
        self._hold_run_lock()
        self.dataset = build_dataset(cfg.data, cfg.job.seed)
        self.guard = NonFiniteGuard(cfg.train.max_bad_steps)
        # Per-step loss and gradient norm stay on the device until a read point (training.job.step_figures);
        # fused AdamW skips a non-finite step's update there. The other implementations take no device flag:
        # their guard reads the figures on every step, before the optimizer steps.
        self.figures = StepFigures(self.guard)
        self.skip_on_device = cfg.train.adamw_impl == "fused"
        self._unrecorded: list[dict] = []  # metrics records of finished steps whose figures are not read yet
        self._read_values: dict[int, tuple[float, float]] = {}  # step -> (loss, grad_norm), read, not recorded
        self.recorded_step = 0  # the newest step with a metrics record (a diverged run's `end` record's step)
        self.fingerprint = run_fingerprint(
            cfg, data_label=cfg.data.source, data_digest=digest_tokens(self.dataset.tokens)
        )
        self._build_checkpointing()
        self._finished = False
        self._joiner_agreed = False  # every rank agreed at this step's boundary that a joiner is let in
        self.keep_memory = True  # False: a stop whose snapshots must not be restored (divergence)
        self._signal = 0
        for s in HANDLED_SIGNALS:
            signal.signal(s, self._on_signal)
        self.clock.mark("job_setup")

    def _hold_run_lock(self) -> None:
        """Rank 0 holds the run lock. The job's first rank 0 took it with every rank (``lock_for_job``); a process
        that is rank 0 without it joined a running job in the place of a lost rank 0 (its flock went with that
        process), or became rank 0 in an in-place recovery: it takes it alone, as a restart's rank 0 would, so a
        second run can never start on this checkpoint.dir while the job goes on."""
        if self.rank == 0 and self.run_lock is None:
            self.run_lock = lock_alone(self.cfg.checkpoint.dir, wait_same_run_s=self.cfg.parallel.init_timeout_s / 2)

    def _build_group_parts(self) -> None:
        """What holds the process group or this rank's place in it: the metrics (rank 0 writes), the progress
        tracker (the group's timeout), the peer watchdog, the device mesh. Collective; built again, in the same
        order on every member, after an in-place recovery."""
        cfg, p = self.cfg, self.cfg.parallel
        if self.metrics is not None:
            self.metrics.close()
        try:
            self.metrics = MetricsLogger(cfg.metrics, rank=self.rank, total_steps=cfg.train.steps)
            problem = None
        except OSError as e:
            problem = (
                f"metrics.path {cfg.metrics.path} cannot be written: {storage_reason(e)}; point "
                "--metrics.path or --job.out_dir at a writable directory"
            )
        self._raise_if_any(problem, ConfigError)
        # The main thread's phases, for the heartbeat (a wedged rank) and the process group's timeout
        self.tracker = ProgressTracker.from_config(cfg, say=self.metrics.info)
        if self.watchdog is not None:
            self.watchdog.close()
        self.watchdog = PeerWatchdog.build(
            p, rank=self.rank, world=self.world, on_silent=self._on_silent_peer, progress=self.tracker
        )
        self.watchdog.start()
        self.mesh = init_device_mesh(self.device.type, (self.world,), mesh_dim_names=self.failover.mesh_dims())

    def _prebuild(self) -> Prebuild:
        """The model's meta-device build on a thread (training.job.prebuild): it needs no group."""
        return Prebuild(lambda: build_model_for_sharding(self.cfg.model, seed=self.cfg.job.seed), "model-prebuild")

    def _build_model(self, prebuilt: Prebuild | None = None) -> None:
        """The model sharded over the mesh (FSDP2), its optimizer and schedule, and the state they make up;
        ``prebuilt``: its meta build, started while the group formed."""
        cfg, p = self.cfg, self.cfg.parallel
        # Built on the meta device; after sharding each rank materialises only its shards (training.model.meta_init).
        built = prebuilt.result() if prebuilt else build_model_for_sharding(cfg.model, seed=cfg.job.seed)
        self.model = built.model
        self.n_params = count_params(self.model)
        if p.activation_checkpointing:
            apply_activation_checkpointing(self.model)
        apply_regional_compile(self.model, self.clock.compiled)  # inside checkpointing, outside FSDP hooks
        apply_fsdp(self.model, self.mesh, p)
        # Values come from the restore, or from the seed when there is none (_resume's fresh_weights): drawing
        # them first cost every restart the whole model's draws on one CPU core (t5-large: 18 of an H200
        # worker's 43 s start), and every in-place survivor too, for weights the restore overwrites.
        built.allocate(self.model, self.device)
        self._initial_weights = built
        t = cfg.train
        # train.adamw_impl: fused by default (training.job.optimizer says why)
        self.optimizer = build_adamw(self.model.parameters(), lr=t.lr, weight_decay=t.weight_decay, impl=t.adamw_impl)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(t.warmup_steps, t.steps))
        self.progress = Progress()
        self.rng = RngState(self.device)
        self.state = {
            "train": TrainState(self.model, self.optimizer, self.scheduler, self.progress),
            RngState.key(self.rank): self.rng,
        }

    def _build_checkpointing(self, host: HostBuffers | None = None) -> None:
        """Fault points, both checkpoint tiers (their gloo groups) and the straggler watch. Collective. ``host``: the
        host buffers an in-place survivor's previous tiers handed over (training.checkpoint.host_buffers)."""
        cfg = self.cfg
        self.faults = Faults(cfg.fault, rank=self.rank, out_dir=cfg.job.out_dir, interrupted=lambda: bool(self._signal))
        # Both checkpoint tiers and the policy over them; fp32 weights + AdamW's two fp32 moments is what one
        # storage checkpoint of this model takes.
        self.ckpt = CheckpointManager(
            cfg.checkpoint,
            rank=self.rank,
            world=self.world,
            device=self.device,
            signature=model_signature(cfg.model),
            fingerprint=self.fingerprint,
            checkpoint_bytes=12 * self.n_params,
            faults=self.faults,
            before_save=lambda step: self.guard.check_weights(self.model, step),
            on_commit=lambda s: self.metrics.event("checkpoint", step=s, committed=True),
            say=self.metrics.info,
            on_save=lambda sync: self.tracker.enter(FINAL_CHECKPOINT if sync else CHECKPOINT),
            on_snapshot=lambda: self.tracker.enter(SNAPSHOT),
            record=self.metrics.event,
            host=host,
        )
        self.stragglers = StragglerWatch.build(
            cfg.straggler,
            model=self.model,
            optimizer=self.optimizer,
            device=self.device,
            rank=self.rank,
            world=self.world,
            out_dir=cfg.job.out_dir,
            snapshot_due=self.ckpt.memory.due,
            settle=self.ckpt.settle,
            metrics=self.metrics,
            last_step=cfg.train.steps,
        )

    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGINT and self._signal == signal.SIGINT:
            # A second Ctrl-C: the user will not wait for the checkpoint. The last complete one is kept.
            os.write(2, f"rank {self.rank}: second SIGINT, exiting without a checkpoint\n".encode())
            os._exit(128 + signum)
        self._signal = signum  # acted on at the next step boundary, by all ranks together

    def _raise_if_any(self, problem: str | None, error: type[Exception]) -> None:
        """Raise `error` on every rank if any rank found a problem (rank 0's or the first one's text)."""
        found: list = [None] * self.world
        dist.all_gather_object(found, problem)
        problem = next((p for p in found if p), None)
        if problem:
            raise error(problem)

    def _agreed_stop(self) -> int:
        """The signal any rank received (0: none), the same on every rank; the checkpoint tiers' failures are
        agreed in the same collective and acted on (a failed snapshot: memory tier off; a failed save: stop), and
        so is a joiner rank 0 saw checked in (failover.in_place: the group re-forms after this step)."""
        # Host values, reduced over gloo (the process group's CPU backend): no wait for the GPU.
        flag = torch.tensor([self._signal, *self.ckpt.local_failures(), self.failover.joiner_seen()], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.ckpt.act_on_failures(save_failed=bool(flag[1].item()), snapshot_failed=bool(flag[2].item()))
        self._joiner_agreed = bool(flag[3].item())
        return int(flag[0].item())

    def _train_objects(self) -> dict:
        return dict(model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, progress=self.progress)

    def _resume(self, held: int | None = None) -> int | None:
        """Restore (collective); ``held``: the step this rank's state objects already hold (CheckpointManager).
        A fresh start draws the seed's initial weights (the kept state of ``held`` needs none)."""
        fresh = self._timed_initial_weights if held is None else lambda: None
        step = self.ckpt.restore(self.state, {"train": ModelOnly(self.model)}, held=held, fresh_weights=fresh)
        if self.ckpt.restored_from and self.ckpt.restored_from["tier"] == "storage":
            self._apply_accepted_changes()
        return step

    def start_from_seed(self) -> None:
        """Give the model the seed's initial weights, bitwise those of a CPU build: what a fresh start's restore
        does, for tools that train without one (training.bench, training.batch_fit)."""
        self._initial_weights.initialize(self.model)

    def _timed_initial_weights(self) -> None:
        self.clock.mark("restore")
        self.start_from_seed()
        self.clock.mark("model_build")  # counted where it was before it moved here (StartupClock adds up)

    def _apply_accepted_changes(self) -> None:
        """Make accepted setting changes take effect: the loaded optimizer/scheduler state carries the old ones."""
        t, fields = self.cfg.train, {c.field for c in self.ckpt.accepted}
        for c in self.ckpt.accepted:
            self.metrics.info(
                f"accepted change {c.field}: {show(c.saved)} -> {show(c.now)}: "
                f"{c.effect(self.progress.step, self.progress.data_offset)}"
            )
        if fields & {"train.lr", "train.warmup_steps", "train.steps"}:
            # LambdaLR keeps base_lrs in its state and takes its curve from the (new) lambda: rebase the
            # curve on the new peak and set the current lr from it, so the very next step uses it.
            self.scheduler.base_lrs = [t.lr for _ in self.optimizer.param_groups]
            for g, fn in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
                g["initial_lr"] = t.lr
                g["lr"] = t.lr * fn(self.scheduler.last_epoch)
        if "train.weight_decay" in fields:
            for g in self.optimizer.param_groups:
                g["weight_decay"] = t.weight_decay

    def _after_first_step(self) -> None:
        """Keep what the first step compiled (training.model.compile_cache); a cache that cannot be written costs
        the next start its compile, never this run."""
        try:
            self.compile_cache.after_first_step()
        except OSError as e:
            self.metrics.info(
                f"[compile] cannot keep the compiled artefacts in {self.cfg.parallel.compile_cache_dir} "
                f"({storage_reason(e)}): the next start compiles again; point --parallel.compile_cache_dir at a "
                "writable directory, or 'off'"
            )

    def _on_silent_peer(self, line: str) -> None:
        """Called by the watchdog's thread right before it ends this worker: the attempt's end record."""
        step = self.progress.step if hasattr(self, "progress") else 0
        self.metrics.end("crashed", step, detail=line)

    def _per_rank_batch_text(self) -> str:
        per_rank = self.cfg.train.global_batch // self.world
        micro = self.cfg.train.micro_batch or per_rank
        n = -(-per_rank // micro)
        return f"{per_rank} per rank" + (f" in {n} micro-batches of <= {micro}" if n > 1 else "")

    def _read_point(self, step: int, stop: bool) -> bool:
        """Whether the host reads the figures after `step`: something needs them (the progress line, a stop, the
        last step, a fault that ends the process) or a checkpoint or snapshot is due, which must never hold a
        state the guard would refuse. The same on every rank (the flush has no collective, the save after it has)."""
        return (
            stop
            or step == self.cfg.train.steps
            or step % self.cfg.metrics.log_every == 0
            or self.ckpt.due(step)
            or self.faults.ends_process_at(step)
        )

    def _read_figures(self) -> None:
        """Read the unread steps' figures (one wait for the device), the guard judging each in order (Diverged at
        the first step it refuses: records of the steps before it are written first), then record them."""
        try:
            for step, loss, grad_norm in self.figures.read():
                self._read_values[step] = (loss, grad_norm)
        finally:
            self._record_read_steps()

    def _record_read_steps(self) -> None:
        """Write the metrics records of the finished steps whose figures are read, in step order."""
        while self._unrecorded and self._unrecorded[0]["step"] in self._read_values:
            record = self._unrecorded.pop(0)
            record["loss"], record["grad_norm"] = self._read_values.pop(record["step"])
            self.metrics.step(**record)
            self.recorded_step = record["step"]

    def _step(self, batch: dict[str, torch.Tensor] | None, problem: str | None = None) -> int:
        # Token counts from the host copy of the batch, reduced over gloo: reading them from the GPU would make
        # the host wait for the device before it can queue this step's forward pass. The third count: ranks
        # that could not read their batch (`problem`); every rank then stops with that rank's message.
        counts = (
            torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
            if batch is None
            else torch.stack([(batch["labels"] != -100).sum(), batch["attention_mask"].sum(), torch.tensor(0)]).to(
                torch.float64
            )
        )
        dist.all_reduce(counts)
        if counts[2].item():
            self._raise_if_any(problem, DataSourceError)
        n_targets, n_tokens = counts[0].item(), counts[1].item() + counts[0].item()
        step = self.progress.step + 1
        self.tracker.enter(FORWARD_BACKWARD)
        self.faults.mid_step(step)
        ids = batch["input_ids"].to(self.device, non_blocking=True)
        host_mask = padding_mask_or_none(batch["attention_mask"])
        mask = None if host_mask is None else host_mask.to(self.device, non_blocking=True)
        labels = batch["labels"].to(self.device, non_blocking=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        # At most train.micro_batch samples per forward; gradients accumulate over the micro-batches (each one
        # reduce-scatters its gradients, so only sharded gradients are held in between).
        micro = self.cfg.train.micro_batch or ids.size(0)
        masks = [None] * len(ids.split(micro)) if mask is None else mask.split(micro)
        for mb_ids, mb_mask, mb_labels in zip(ids.split(micro), masks, labels.split(micro)):
            logits = self.model(
                input_ids=mb_ids, attention_mask=mb_mask, decoder_input_ids=self.model._shift_right(mb_labels)
            ).logits
            mb_loss = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)), mb_labels.view(-1), ignore_index=-100, reduction="sum"
            )
            # Normalise by the global target count; FSDP averages gradients over ranks, hence x world.
            # The gradient is then that of the global mean loss, whatever the world size or micro-batching.
            mb_loss = self.faults.loss(step, mb_loss)
            (mb_loss * (self.world / n_targets)).backward()
            loss_sum += mb_loss.detach()
        self.tracker.enter(OPTIMIZER)
        max_norm = self.cfg.train.max_grad_norm or float("inf")
        grad_norm = clip_grad_norm(self.model.parameters(), max_norm)  # on the local shards: no DTensor dispatch
        dist.all_reduce(loss_sum)
        figures = torch.stack([loss_sum, grad_norm.to(loss_sum.dtype)])
        self.figures.add(step, figures, n_targets)  # read at the next read point, not here
        self.ckpt.before_optimizer_step()
        if self.skip_on_device:  # a non-finite step keeps the weights as they were, decided without a host read
            optimizer_step_unless(self.optimizer, (~torch.isfinite(figures).all()).to(torch.float32))
        else:  # the host decides before the optimizer steps: this step's one wait for the device
            self._read_figures()
            if self.guard.ok_to_checkpoint():
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return int(n_tokens)

    def train(self) -> int:
        cfg, t = self.cfg, self.cfg.train
        resumed = self._resume()
        self.ckpt.check_no_clash(self.progress.step + 1, t.steps)
        self.clock.mark("restore")
        record = dict(
            world_size=self.world,
            restart_count=self.restart_count,
            resumed_from=resumed,
            host=socket.gethostname(),
            params=self.n_params,
            preset=cfg.preset,
            accepted_changes=[c.field for c in self.ckpt.accepted],
            restored_from=self.ckpt.restored_from,
            startup=self.clock.summary(),
            compile_cache=self.compile_cache_record,
        )
        if self.failover.joined_epoch() is None:
            self.metrics.event("start", **record)
        else:  # a replacement or a spare's worker that joined the running job: no new attempt of the job starts
            self.metrics.event("in_place", **record, **self._joined_record(record["startup"]))
        if self.rank == 0:  # what this attempt runs with, readable and reusable as --config
            Path(cfg.job.out_dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.job.out_dir) / "config.toml").write_text(to_toml(cfg))
        if self.progress.step >= t.steps:
            self.metrics.info(
                f"already finished: step {self.progress.step} of {t.steps} is checkpointed in "
                f"{cfg.checkpoint.dir}; nothing to do"
            )
            self._finished = True
            self.metrics.end("already_finished", self.progress.step)
            return 0
        self.metrics.info(
            f"training {cfg.preset}: {self.n_params / 1e6:.1f}M params, world {self.world}, "
            f"{self.device.type}/{cfg.parallel.precision}, steps {self.progress.step + 1}..{t.steps}, "
            f"global batch {t.global_batch} ({self._per_rank_batch_text()}), "
            f"{len(self.dataset)} samples per epoch"
        )
        self._open_attempt(resumed)
        try:
            exit_code = self._loop()
        except Exception as e:
            # The records of the steps done since the last read point, as they would have been written (and
            # the guard's verdict on them, which comes first). Not after a collective failed: a device read
            # could wait on that collective.
            if not isinstance(e, dist.DistError):
                self._read_figures()
            raise
        return exit_code

    def _open_attempt(self, resumed: int | None) -> None:
        """The data position, RNG and recovery note of the state just restored (at start, or after an in-place
        recovery): the loop goes on from here."""
        cfg, t = self.cfg, self.cfg.train
        self.loader = iter(
            build_dataloader(
                self.dataset,
                cfg.data,
                seed=cfg.job.seed,
                global_batch=t.global_batch,
                rank=self.rank,
                world=self.world,
                start_offset=self.progress.data_offset,
                pin_memory=self.device.type == "cuda",
            )
        )
        if not self.rng.apply_loaded():
            # Fresh start, or a rank that did not exist when the checkpoint was written (world grew).
            torch.manual_seed(cfg.job.seed * 100_003 + self.rank * 7_919 + self.progress.step)
            if self.device.type == "cuda":
                torch.cuda.manual_seed(cfg.job.seed * 100_003 + self.rank * 7_919 + self.progress.step)
        self.model.train()
        self.recovery = RecoveryNote.build(
            cfg.metrics.path,
            rank=self.rank,
            restart_count=self.restart_count,
            resumed_from=resumed,
            restored_from=self.ckpt.restored_from,
            say=self.metrics.info,
        )
        self.resumed_at = self.recorded_step = self.progress.step
        self._step_end_rng = self.rng.state_dict()

    def _loop(self) -> int:
        t = self.cfg.train
        exit_code = None
        while self.progress.step < t.steps and exit_code is None:
            failed = ""
            try:
                exit_code = self._iteration()
            except self.failover.catches as e:  # failover.in_place: a peer lost in a collective (else: nothing)
                failed = self.failover.peer_lost(e)
                if not failed:
                    raise
            # Outside the except block: its traceback holds the failed collective and with it the old group's
            # connections, which a survivor blocked on this rank waits on (training.job.inplace.group).
            if failed or self._joiner_agreed:
                self._recover_in_place(failed)
        if exit_code is None:
            self._finished = True
            self.metrics.end("finished", self.progress.step)
            self.metrics.info(
                f"finished {t.steps} steps; final checkpoint "
                f"{self.cfg.checkpoint.dir}/step_{t.steps:08d}, metrics {self.cfg.metrics.path}"
            )
        return exit_code or 0

    def _iteration(self) -> int | None:
        """One step and its boundary (the agreed stop, records, saves); the exit code when the ranks agreed to
        stop, else None."""
        t = self.cfg.train
        self.tracker.enter(DATA, self.progress.step + 1)
        t0 = time.perf_counter()
        offset = self.progress.data_offset
        n_tokens = self._step(*_next_batch(self.loader))
        self.progress.step += 1
        self.progress.tokens_seen += n_tokens
        self.progress.data_offset += t.global_batch
        step = self.progress.step
        self._step_end_rng = self.rng.state_dict()  # what this step's snapshot holds; a survivor keeps it
        step_time = time.perf_counter() - t0
        # Past start-up: a hung or vanished peer must fail fast, within what the steps so far took
        self.tracker.step_done(step)
        sig = self._agreed_stop()
        read_point = self._read_point(step, stop=bool(sig))
        if read_point:  # before any save or snapshot of this step: the guard judges every step up to it
            self._read_figures()
        blocked, snapshot_blocked = self.ckpt.save(
            step, self.state, stop=bool(sig), final=step == t.steps, progress=self.progress.state_dict()
        )
        self._unrecorded.append(
            dict(
                step=step,
                loss=None,  # loss and grad_norm: filled in when the step's figures are read
                lr=self.scheduler.get_last_lr()[0],
                grad_norm=None,
                tokens_per_s=n_tokens / step_time,
                step_time_s=step_time,
                ckpt_block_s=blocked,
                snapshot_block_s=snapshot_blocked,
                snapshot_interval=self.ckpt.snapshot_interval,
                world_size=self.world,
                restart_count=self.restart_count,
                data_offset=offset,
                tokens=n_tokens,
            )
        )
        self._record_read_steps()  # the records whose figures are read (this step's too at a read point)
        if self.progress.step == self.resumed_at + 1:  # this attempt's first step compiled what it needs
            self._after_first_step()
        self.faults.after_step(step, snapshot_written=self.ckpt.memory.wait)
        self.recovery.after_step(step)
        if sig:
            name = signal.Signals(sig).name
            self.metrics.event("signal", signal=name, step=step)
            self.metrics.info(f"{name}: checkpoint of step {step} saved; exiting. Relaunch to resume.")
            self.metrics.end("signal", step, detail=name)
            return 128 + sig
        self.stragglers.after_step(step)  # may stop every rank here (Regroup): a straggler's node leaves
        return None

    def _joined_record(self, startup: dict) -> dict:
        """What this process's ``in_place`` record says when it joined a running job (its rank 0 is the job's
        rank 0 now: the survivors' own record of the recovery is not written): the epoch it joined, the step the
        members agreed, no held step (it held no state), its start-up as the recovery's seconds."""
        membership = self.failover.membership
        began = startup.get("began") or time.time()
        return dict(
            epoch=membership.epoch,
            members=list(membership.members),
            joined=True,
            failed="",
            held_step=None,
            agreed_step=membership.step,
            sources=self.ckpt.sources,
            seconds=round(time.time() - began, 3),
        )

    def _recover_in_place(self, failed: str) -> None:
        """failover.in_place, after a collective failed here (``failed``: what it raised) or every rank agreed a
        joiner in: re-form the group (InPlaceFailed, said in one line, ends the worker: a full restart follows),
        build what held the old one on the new one, and restore the state the checkpoint manager chooses (the
        newest step every shard holds in memory: this rank's own, a peer's, re-cut when the world changed)."""
        t0, held = time.time(), self.progress.step
        parts: dict[str, float] = {}
        # The old watchdog watches the old group's heartbeats, the dead rank's too: left running it ended this
        # survivor when the replacement's start took the heartbeat bound (make chaos-test under load, a group
        # restart). The recovery has its own bound (failover.in_place_bound_s); a new one starts on the new group.
        self.watchdog.close(wait=False)
        self.watchdog = None

        def part(name: str, since: float) -> float:
            now = time.time()
            parts[name] = round(now - since, 3)
            return now

        prebuilt = self._prebuild()  # overlaps the agreement's wait for the replacement
        membership = self.failover.recover(held)
        t = part("regroup", t0)
        old = self.ckpt
        kept = old.hand_over_host_buffers()  # its host buffers (page-locked on GPUs) serve the new group's tiers
        # its groups went with the old group; the snapshot in flight is written, unless its exchange is with a rank
        # that was lost (abandoned at once) or blocked on a survivor that left the old group before its own began
        # (abandoned at half the recovery's bound: the new group's first collective, which a joiner may already
        # wait in, times out at the whole bound; waiting the whole bound here ended both, a full restart)
        old.close_after_recovery(wait_s=self.cfg.failover.in_place_bound_s / 2, lost_ranks=self.failover.lost_ranks)
        # what it left running on the old groups (a save blocked on a survivor) fails now, not at its timeout:
        # left blocked, it held this worker's exit (its threads are joined) for checkpoint.timeout_s (CI, once)
        self.failover.cut_left_over()
        moved = (self.rank, self.world) != (dist.get_rank(), dist.get_world_size())
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # Its shards did not move: keep the held step's state (training.job.live_state) instead of reading it back
        live = None if moved else LiveState.capture(step=held, rng=self._step_end_rng, **self._train_objects())
        try:
            check_world(self.cfg, self.world)
        except ConfigError as e:
            lost = InPlaceFailed(
                f"in-place recovery: world size {self.world}: {e}: falling back to a full restart from the newest "
                "complete snapshot"
            )
            say(str(lost))
            raise lost from None
        self._hold_run_lock()
        t = part("release", t)
        self._build_group_parts()
        t = part("group_parts", t)
        self._build_model(prebuilt)
        t = part("model", t)
        if live is not None:
            not_kept = live.install(rng_state=self.rng, **self._train_objects())
            if not_kept:
                say(f"rank {self.rank}: live state not kept ({not_kept}): restoring it")
                live = None
            t = part("keep", t)
        self._build_checkpointing(host=kept)
        t = part("checkpointing", t)
        resumed = self._resume(held=None if live is None else held)
        self.ckpt.check_no_clash(self.progress.step + 1, self.cfg.train.steps)
        part("restore", t)
        self._unrecorded, self._read_values = [], {}  # steps after the restored one are trained again
        self.figures = StepFigures(self.guard)
        seconds = time.time() - t0
        self.metrics.event(
            "in_place",
            epoch=membership.epoch,
            world_size=self.world,
            members=list(membership.members),
            failed=failed,
            held_step=held,
            agreed_step=membership.step,
            resumed_from=resumed,
            restored_from=self.ckpt.restored_from,
            sources=self.ckpt.sources,  # where each rank's state came from (live: kept, nothing read)
            # this rank's host buffers (page-locked on GPUs) the new tiers reuse, and how many they made anew
            host_buffers=dict(kept_bytes=kept.nbytes, made=self.ckpt.host.allocations),
            seconds=round(seconds, 3),
            parts=parts,
        )
        say(
            f"rank {self.rank} of {self.world} (pid {os.getpid()}): resumed at step {resumed} in {seconds:.3f} s "
            f"{parts} (held step {held}; {'after ' + failed[:80] if failed else 'a joiner let in'})"
        )
        self._open_attempt(resumed)

    def close(self) -> None:
        self.tracker.enter(CLOSING)  # waits for the last writes: bounded like the start-up, not like a step
        try:
            self.ckpt.close(discard_memory=self._finished or not self.keep_memory)
        finally:
            self.metrics.close()
            if self.run_lock is not None:
                self.run_lock.release()  # after the last checkpoint write
            self.watchdog.close()  # after the last collective: from here on this rank's silence is expected
            self.failover.close()
            if dist.is_initialized():
                dist.destroy_process_group()

"""The training job in one process (a worker), and what keeps it honest. One module per concern:

* :mod:`~training.job.trainer`: :class:`Trainer`, the training loop (FSDP2 steps, signals, the step boundary);
* :mod:`~training.job.check`: the start checks of what the settings point at, before any process starts;
* :mod:`~training.job.faults`: fault injection at named points (does nothing unless a ``fault.*`` is set);
* :mod:`~training.job.micro_batch_fit`: which ``train.micro_batch`` fits the GPU and keeps survivors' micro-batches
  the size they were (``python -m training.batch_fit``; the launcher's preflight warns on one that does not);
* :mod:`~training.job.optimizer`: AdamW on the implementation ``train.adamw_impl`` names (fused, foreach, for_loop),
  stepped on the parameters' local shards;
* :mod:`~training.job.grad_clip`: gradient clipping on the gradients' local shards (one all-reduce of the norm);
* :mod:`~training.job.guard`: the non-finite guard (loss, gradients, weights);
* :mod:`~training.job.step_figures`: each step's loss and gradient norm kept on the device until a read point;
* :mod:`~training.job.metrics`: progress lines, the summary and ``metrics.jsonl``;
* :mod:`~training.job.tensorboard`: the same records as TensorBoard event files, on a background thread;
* :mod:`~training.job.trainer_status`: progress into the TrainJob's ``status.trainerStatus`` (Kubeflow Trainer);
* :mod:`~training.job.watchdog`: heartbeats: a silent peer, a hung or wedged worker on this node;
* :mod:`~training.job.progress`: the main thread's phase and step, their observed bounds (a wedged rank), the
  process group's timeout after the warm-up;
* :mod:`~training.job.inplace`: in-process recovery's survivor side (issue #52): agree the next membership epoch
  through the store, rebuild the process group in the same process;
* :mod:`~training.job.failover`: the trainer's failover policy: today's full restart, or in-place recovery
  (``failover.in_place``) with its fall-back to that restart;
* :mod:`~training.job.live_state`: what a survivor of an in-place recovery keeps instead of restoring it (its live
  shards, optimizer state, schedule, progress, the step-end RNG);
* :mod:`~training.job.prebuild`: the model's meta build on a thread while the process waits for its group;
* :mod:`~training.job.recovery`: the one line after an automatic restart (what happened, what it cost);
* :mod:`~training.job.stragglers`: a rank persistently slower than the others: named, its node taken out for a spare;
* :mod:`~training.job.agent_notes`: the notes between a node's agent and its workers (spares waiting, take-out, a
  request to cut a blocked group);
* :mod:`~training.job.lifecycle`: a worker's process lifecycle (parent death, exit without finalization);
* :mod:`~training.job.startup`: the start-up clock (the restart breakdown's phases);
* :mod:`~training.job.determinism`: deterministic kernels on request.

The entry point is ``python -m training`` (``training/__main__.py``).
"""

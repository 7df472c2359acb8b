"""The environment torchrun's agents and workers need on every platform: set by the launcher
(:func:`training.launch.commands.launch_env`) and by the EKS runtime for every training pod, so that a TrainJob that
runs torchrun itself instead of the launcher gets it too.

Both are read by torch, not by this project. ``TORCH_ELASTIC_WORKER_IDENTICAL`` is documented only in a private
method, so ``training/torch_private.py`` lists it, with a canary test.
"""

from __future__ import annotations

#: torch 2.13: a node joining a later rendezvous round deadlocks while agents share the rendezvous TCPStore with
#: their workers (pytorch#147064). With this set, each round's rank-0 worker hosts its own store.
RDZV_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

#: torchrun gives each node's workers their ranks from the node's rendezvous rank (rank x workers per node + local
#: rank) instead of gathering every agent's worker count through rank 0's store: the same ranks when every node
#: runs as many workers. That holds for a fixed worker count (the launcher's integer --nproc-per-node; a TrainJob's
#: numProcPerNode, one value for all its pods on one GPU instance type). The gather waited the store's timeout
#: (30 s) for a node lost between a round's forming and its ranks, then failed every agent; without it such a node
#: is an ordinary lost node (its lease expires, the round re-forms).
IDENTICAL_WORKERS_ENV = {"TORCH_ELASTIC_WORKER_IDENTICAL": "1"}

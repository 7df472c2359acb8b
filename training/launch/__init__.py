"""Elastic launcher: one torchrun command line for this machine, Slurm and Kubeflow Trainer.

``python -m training.launch --help`` documents the CLI (:mod:`training.launch.cli`). The modules, one concern each:

* :mod:`~training.launch.config`: the typed :class:`LaunchConfig` and :class:`LaunchError`;
* :mod:`~training.launch.cli`: ``python -m training.launch`` (:mod:`.__main__`): the command line -> a config;
* :mod:`~training.launch.commands`: torchrun / store command lines and agent environment from a config;
* :mod:`~training.launch.from_env`: local, Slurm and Kubeflow ``PET_*`` variables -> config;
* :mod:`~training.launch.hostlist`: the first host of a Slurm hostlist;
* :mod:`~training.launch.preflight`: training-argument checks before any agent starts;
* :mod:`~training.launch.store_check`: does the standalone store answer, and serve this job (``--job-id``)?
* :mod:`~training.launch.local`: simulated nodes here (3 etcd members on loopback, or with
  ``T5_COORDINATOR=store`` a standalone c10d store, plus one agent per node); its work directory, and the removal
  of those a killed launcher left: :mod:`~training.launch.workdir`;
* :mod:`~training.launch.agent`: the torchrun agent every platform runs, with clean stops on Ctrl-C;
* :mod:`~training.launch.spawn_time`: each worker's spawn time in its environment (its start-up clock's origin);
* :mod:`~training.launch.warm_workers`: workers forked from a per-node forkserver that imported torch once;
  :mod:`~training.launch.forkserver_init` is the forkserver's last preload (its checks); a cold worker runs
  :mod:`~training.launch.worker` (the training module with the commit fence's etcd side installed);
* :mod:`~training.launch.inplace_board`: in-process recovery's membership board on the job's etcd (the store side
  of :mod:`training.job.inplace`, for ``failover.in_place``);
* :mod:`~training.launch.inplace_agent`: the agent of a ``failover.in_place`` job: a worker killed by a signal is
  reported gone on that board and replaced alone (torch's ``SimpleElasticAgent`` extension point);
  :mod:`~training.launch.worker_exits` wakes it the moment a worker ends (Linux pidfds), not at its next look;
* :mod:`~training.launch.nccl_plugin`: warns when a node has RDMA devices but NCCL's network plugin does not load;
* :mod:`~training.launch.rendezvous`: membership on etcd (``--rdzv-backend=t5-etcd``): :mod:`.rendezvous.handler`
  (torch's handler interface, registered through its public registry), :mod:`.rendezvous.rounds` (the round
  decisions, pure), :mod:`.rendezvous.client` (etcd's v3 JSON API over TLS), :mod:`.rendezvous.members` (a
  local 3-member etcd), :mod:`.rendezvous.certs` (its TLS material), :mod:`.rendezvous.admin` (a job's etcd
  user and role).

torch's c10d rendezvous on a standalone store (``python -m training.rdzv_store``, ``T5_COORDINATOR=store``)
remains for comparison and for a cluster without etcd, as torch ships it.

The names below are re-exported so callers can keep ``from training.launch import ...``. Importing this
package never imports torch: it runs before torch is needed.
"""

from training.launch.cli import build_parser, config_from_args, main
from training.launch.commands import format_argv, launch_env, rdzv_conf, store_argv, torchrun_argv, training_argv
from training.launch.config import DEFAULT_RDZV_PORT, RDZV_ENV, LaunchConfig, LaunchError, RdzvTuning
from training.launch.from_env import config_from_env, config_from_local, config_from_pet, config_from_slurm
from training.launch.hostlist import expand_first_host, slurm_first_host
from training.launch.local import run_local, start_store
from training.launch.preflight import preflight

__all__ = [
    "DEFAULT_RDZV_PORT",
    "RDZV_ENV",
    "LaunchConfig",
    "LaunchError",
    "RdzvTuning",
    "format_argv",
    "launch_env",
    "rdzv_conf",
    "store_argv",
    "torchrun_argv",
    "training_argv",
    "config_from_env",
    "config_from_local",
    "config_from_pet",
    "config_from_slurm",
    "expand_first_host",
    "slurm_first_host",
    "preflight",
    "run_local",
    "start_store",
    "build_parser",
    "config_from_args",
    "main",
]

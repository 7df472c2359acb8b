"""``python -m training.launch.agent [torchrun options] -m training ...``: torchrun's agent, stopping cleanly.

Runs the torchrun agent in this process with the same arguments, as ``torch.distributed.run.main`` does (its
``parse_args``, ``config_from_args`` and the public ``elastic_launch``, :func:`_launch`); what it adds is how the
agent stops:

* SIGINT (Ctrl-C) or SIGTERM: the agent passes the signal to its workers, which checkpoint at the next step
  and exit (``python -m training``); then this prints one line and exits 128+signum, where torchrun
  re-raises ``SignalException`` with a traceback.
* a second SIGINT: stop at once, without waiting for the checkpoint: this process dies by SIGINT and its
  workers with it (they die with their agent, :func:`training.job.lifecycle.die_with_agent`). A second SIGTERM
  keeps torchrun's behaviour (Slurm may send several while a checkpoint is being written).
* started by the local launcher (``T5_DIE_WITH_PARENT``), the agent gets SIGTERM when the launcher dies.
* a worker that stops with one of the training module's exit codes (2-7: bad settings, another run's
  checkpoint, divergence, failing storage, busy directory; 9: its worker group was replaced by a newer round,
  :mod:`training.checkpoint.fence`) ends the agent with that code and one line
  instead of torchrun's "training FAILED" block (exit 1), which is kept for crashes; the group is not restarted
  for it (the worker tells the agent, :func:`training.job.watchdog.tell_agent_final_exit`): it would stop the
  same way.
* jobs of the training module are checked on this node first (:mod:`training.job.check`: data, output
  locations, GPUs): a problem is one line and its exit code (2, or 6 for checkpoint storage) before any
  worker starts.
* a worker of the training module that stops sending heartbeats (stopped) is SIGKILLed by this agent after its
  ``parallel.heartbeat_timeout_s``, one that declares itself wedged (its main loop stuck) at once
  (:class:`training.job.watchdog.NodeWatchdog`), so the agent restarts at once instead of after torch's fixed
  30 s wait for a stopped process.
* membership on etcd (``--rdzv-backend=t5-etcd``, :mod:`training.launch.rendezvous`, registered here through
  torch's public handler registry): a node whose lease expires is named in one line and this node's workers,
  blocked in a collective with it, are SIGKILLed at once (:meth:`training.job.watchdog.NodeWatchdog.kill_all`);
  a hot spare that was never needed exits 0 when the job finishes, a node whose worker group was re-forming in
  the job's newest round when another node ended the job (its restarts used up) exits 1 with one line; a node
  taken out as a straggler (:mod:`training.job.stragglers`) leaves the job with one line and exit 0. torch's c10d
  rendezvous (``--rdzv-backend=c10d``, ``T5_COORDINATOR=store``) runs as torch ships it: no hot spares there
  (:class:`training.launch.config.LaunchConfig` refuses them).
* workers of the training module start warm: forked from a process that imported torch and the model once
  (:mod:`training.launch.warm_workers`; ``T5_WARM_WORKERS=0`` starts each as a fresh interpreter).
* with a standalone store (``is_host=false``), the agent first checks that a store answers at the endpoint, that
  it serves this rendezvous id (``--job-id``), and that the id's rendezvous is neither closed nor another job's
  (:mod:`training.launch.store_check`): exit 2 with one line naming the endpoint, the ids or the other job,
  before it touches the rendezvous.
* membership on etcd: before anything else starts (the warm workers' forkserver included), the agent checks its
  ``T5_ETCD_*`` settings against the store and that the rendezvous id is this job's
  (:mod:`training.launch.rendezvous.start`): a wrong setting, a closed rendezvous (its job ended) or another job's
  id is one line naming it and the fix, exit 2. The job's identity is ``T5_JOB_IDENTITY`` when set, else the
  training's absolute ``--job.out_dir`` (:func:`_job_identity`).
* ``--standalone`` jobs of the training module check the checkpoint directory's run lock first
  (:mod:`training.checkpoint.run_lock`): a busy directory exits 7 before any worker starts. Elastic multi-node jobs
  do not: a replacement node joins while the job (holding the lock) runs.

* ``failover.in_place`` jobs on etcd (``--rdzv-backend=t5-etcd``): a worker killed by a signal is reported gone on
  the job's membership board and replaced alone, its peers keep their processes and recover in place; anything
  else (a worker's own exit, two failures at once, a failure while the replacement joins) is the full restart
  (:mod:`training.launch.inplace_agent`, docs/inprocess.md). Every other job runs torchrun's ``elastic_launch``.

Every platform runs this module (:func:`training.launch.commands.torchrun_argv`), and ``make train`` too.
"""

from __future__ import annotations

import os
import signal
import sys

from training.job.check import DONE_ENV, already_checked
from training.launch.config import RDZV_ENV, LaunchError
from training.launch.nccl_plugin import missing_plugin_warning
from training.launch.preflight import check_training_job, checkpoint_dir, in_place, job_out_dir
from training.launch.store_check import check_store
from training.launch import warm_workers
from training.job.lifecycle import AGENT_ENV, die_with_launcher, exit_without_finalization
from training.checkpoint.run_lock import EXIT_BUSY, CheckpointDirBusy, RunLock
from training.job.watchdog import NodeWatchdog

# torchrun's default --signals-to-handle, less SIGINT, which this module handles (torch would re-install its
# own handler, the one that forgets a first signal was already received, every time it starts workers).
_TORCH_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
# The training module's own exit codes (python -m training: 2 config ... 7 busy directory, 9 a worker group the
# commit fence found replaced: training.checkpoint.fence); passed through.
KNOWN_EXIT_CODES = (2, 3, 4, 5, 6, EXIT_BUSY, 9)


def _signals_to_handle() -> str:
    base = os.environ.get("PET_SIGNALS_TO_HANDLE") or _TORCH_SIGNALS  # torchrun reads this variable too
    return ",".join(s.strip() for s in base.split(",") if s.strip() and s.strip() != "SIGINT")


def _abort_on_second_sigint(signal_exception: type, workers: list) -> None:
    """First SIGINT: raise torch's SignalException (the agent stops its workers the clean way). Second: SIGKILL
    the workers (``workers``: the NodeWatchdog, once there is one) and die."""
    count = 0

    def handler(signum, _frame):
        nonlocal count
        count += 1
        if count == 1:
            raise signal_exception(f"Process {os.getpid()} got signal: SIGINT", sigval=signal.SIGINT)
        print(
            "[agent] second SIGINT: stopping at once, without the checkpoint (the last complete one is kept)",
            file=sys.stderr,
            flush=True,
        )
        for watchdog in workers:  # before this process goes: a worker must not outlive it, nor race its peers' end
            watchdog.kill_all("second SIGINT")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # die *by* SIGINT, so a calling shell or make stops as well

    signal.signal(signal.SIGINT, handler)


def _is_training(args) -> bool:
    return bool(args.module and args.training_script == "training")


def _nproc(args) -> int | None:
    """torchrun's --nproc-per-node as a number (None for 'gpu', 'auto', ...: torchrun resolves those)."""
    try:
        return int(args.nproc_per_node)
    except (TypeError, ValueError):
        return None


def _fixed_world(args) -> int | None:
    """The world size when it cannot change (--standalone, or --nnodes N without a range); else None."""
    nproc, nnodes = _nproc(args), "1" if args.standalone else str(args.nnodes)
    return nproc * int(nnodes) if nproc and nnodes.isdigit() else None


def _rdzv_conf(args) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in (args.rdzv_conf or "").split(",") if "=" in kv)


def _external_store(args) -> tuple[str, float] | None:
    """(endpoint, connect timeout) when the agents connect to a standalone c10d store (``is_host=false``)."""
    conf = _rdzv_conf(args)
    if args.standalone or args.rdzv_backend != "c10d" or conf.get("is_host", "").lower() not in ("false", "0"):
        return None
    return args.rdzv_endpoint, float(conf.get("read_timeout", 60))  # torch connects with read_timeout too


def _job_description(args) -> str:
    """What every agent of one job shares and two jobs hardly ever do: node counts, workers, what they run, a
    digest of its arguments (store_check.check_rendezvous tells jobs apart by it)."""
    import hashlib

    digest = hashlib.sha256("\0".join(args.training_script_args).encode()).hexdigest()[:10]
    what = f"-m {args.training_script}" if args.module else args.training_script
    return f"nnodes {args.nnodes}, nproc {args.nproc_per_node}, {what}, arguments {digest}"


def _job_identity(args) -> str:
    """What every agent of this job gives as its identity on etcd (:mod:`training.launch.rendezvous.start`):
    ``T5_JOB_IDENTITY``, else the training's output directory (absolute: the nodes of a job share it, two jobs
    never do), else the job's description (another module)."""
    from training.launch.rendezvous.start import IDENTITY_ENV

    given = os.environ.get(IDENTITY_ENV, "").strip()
    if given:
        return given
    out_dir = job_out_dir(args.training_script_args) if _is_training(args) else None
    return f"out_dir {os.path.abspath(out_dir)}" if out_dir else _job_description(args)


def _check_etcd_start(args) -> int | None:
    """None when this agent may join its rendezvous on etcd; else the one line is printed and the agent's exit
    code returned (0: its job ended already), before the forkserver starts: an agent stopped here leaves no
    process behind."""
    from training.launch.rendezvous.start import StartRefused, check_start

    try:
        job_dir = job_out_dir(args.training_script_args) if _is_training(args) else None
        check_start(args.rdzv_id, _job_identity(args), _rdzv_conf(args), job_dir=job_dir)
    except StartRefused as e:
        print(f"error: {e}" if e.code else str(e), file=sys.stderr, flush=True)
        return e.code
    return None


def _stale_after_s(args) -> float:
    """A rendezvous whose newest heartbeat is older than this has no live agent: twice the time torch gives a node
    before calling it dead (keep-alive interval x attempts, torch's defaults 5 x 3), and at least 10 s."""
    conf = _rdzv_conf(args)
    return max(10.0, 2 * float(conf.get("keep_alive_interval", 5)) * float(conf.get("keep_alive_max_attempt", 3)))


def _standalone_checkpoint_dir(args) -> str | None:
    """checkpoint.dir of a ``--standalone -m training`` job (None otherwise, or if its arguments are invalid:
    the workers report those)."""
    if not (args.standalone and _is_training(args)):
        return None
    return checkpoint_dir(args.training_script_args)


def _torchrun_rendezvous_defaults(args) -> None:
    """What torchrun's ``run(args)`` sets before it builds the launch: ``--standalone`` (and a one-node static
    launch with no endpoint) is a c10d rendezvous on localhost under a fresh id; the static master port is 29500."""
    import uuid

    from torch.distributed.run import parse_min_max_nnodes

    one_static_node = (
        args.rdzv_backend == "static"
        and not args.rdzv_endpoint
        and args.master_port is None
        and parse_min_max_nnodes(args.nnodes)[1] == 1
    )
    if args.standalone or one_static_node:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


#: The address other nodes reach a ``failover.in_place`` worker's own store server at (training.job.failover reads it).
INPLACE_HOST_ENV = "T5F_INPLACE_HOST"


def in_place_store_host(local_addr: str | None) -> str:
    """This node's address for its in-place workers' store servers: the one the ``t5-etcd`` rendezvous gives its
    peers for this node (torchrun's ``--local-addr``, else the fully qualified host name), never the loopback the
    worker would take by itself: on separate hosts (the Slurm lab's network namespaces, a cluster's pods) a peer
    connecting to 127.0.0.1 reaches its own host, and the first epoch's group never forms."""
    import socket

    return local_addr or socket.getfqdn()


def _in_place(args) -> bool:
    """Whether this node's workers recover in place (``failover.in_place`` of a training job on the ``t5-etcd``
    rendezvous, whose etcd keeps their membership board): then one dead worker is replaced alone
    (:mod:`training.launch.inplace_agent`). Off, or on another rendezvous (the workers refuse it there), torchrun's
    own agent runs, unchanged."""
    from training.launch.rendezvous import handler as etcd_handler

    return _is_training(args) and args.rdzv_backend == etcd_handler.BACKEND and in_place(args.training_script_args)


def _launch(args, warm: bool) -> None:
    """torchrun's ``run(args)`` through its public pieces (``config_from_args``, then ``elastic_launch``), with the
    warm workers' entrypoint in between when ``warm`` (:func:`warm_workers.apply_warm_start`): torchrun has no hook
    for the entrypoint, and replacing its ``config_from_args`` at run time, as this did before, is what the project
    never does to torch. ``tests/unit/repo/test_torch_private.py`` has the canary for ``run``'s shape."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args

    from training.launch.spawn_time import stamp_spawn_time

    _torchrun_rendezvous_defaults(args)
    config, cmd, cmd_args = config_from_args(args)
    stamp_spawn_time(config)  # each worker's start-up clock begins at its spawn (training.launch.spawn_time)
    if warm:
        config, cmd, cmd_args = warm_workers.apply_warm_start(config, cmd, cmd_args)
    else:
        cmd_args = warm_workers.cold_entry(list(cmd_args))
    if not _in_place(args):
        elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
        return
    from training.job.failover import member_id
    from training.launch import inplace_agent, inplace_board

    inplace_agent.launch(config, cmd, cmd_args, board_for_round=inplace_board.board_from_env, member_id=member_id)


def main(argv: list[str] | None = None) -> int:
    """Run the torchrun agent with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    die_with_launcher(signal.SIGTERM)
    os.environ[AGENT_ENV] = str(os.getpid())  # workers check it at start (the agent may die before they do)
    # Every round's workers get a fresh store (the launcher sets this for its agents; `make train` runs this agent
    # directly): with the agent's store shared, a --standalone group restarted after a worker failure found the
    # failed attempt's gloo addresses and failed to connect (Connection refused) until its restarts ran out.
    for key, value in RDZV_ENV.items():
        os.environ.setdefault(key, value)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Ctrl-C while torch is imported: no worker exists yet, so just end (quietly, as SIGTERM would).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
    from training.launch.rendezvous import handler as etcd_handler

    if not any(a.split("=", 1)[0] in ("--signals-to-handle", "--signals_to_handle") for a in argv):
        argv = [f"--signals-to-handle={_signals_to_handle()}", *argv]
    args = parse_args(argv)
    store = _external_store(args)
    if store:
        try:
            check_store(
                store[0],
                args.rdzv_id,
                connect_timeout_s=store[1],
                job=_job_description(args),
                stale_after_s=_stale_after_s(args),
            )
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
    if args.rdzv_backend == etcd_handler.BACKEND:
        code = _check_etcd_start(args)
        if code is not None:
            return code
    if _is_training(args) and not already_checked():
        # data, output locations and GPUs, from this node, before any worker starts (torchrun would restart
        # a worker that exits 2 --max-restarts times); the workers skip the same check
        code = check_training_job(args.training_script_args, nproc_per_node=_nproc(args), world=_fixed_world(args))
        if code:
            return code
        os.environ[DONE_ENV] = "1"
    if _is_training(args):
        warning = missing_plugin_warning()  # EFA without its NCCL plugin trains, slowly: say so once per node
        if warning:
            print(f"[launch] {warning}", file=sys.stderr, flush=True)
    ckpt_dir = _standalone_checkpoint_dir(args)
    if ckpt_dir:
        try:
            RunLock(ckpt_dir).check()
        except CheckpointDirBusy as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BUSY
    try:
        warm = _is_training(args) and warm_workers.enabled()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    node_watchdogs: list[NodeWatchdog] = []
    _abort_on_second_sigint(SignalException, node_watchdogs)
    on_etcd = args.rdzv_backend == etcd_handler.BACKEND
    if on_etcd:
        etcd_handler.register()
    watchdog = NodeWatchdog.start_for_workers() if _is_training(args) else None
    node_watchdogs += [watchdog] if watchdog is not None else []
    if on_etcd and watchdog is not None:
        etcd_handler.set_on_lost(lambda lost: watchdog.kill_all(f"their round lost {lost}"))
    if _in_place(args):  # before the warm workers' forkserver (and so every worker) takes this environment
        os.environ.setdefault(INPLACE_HOST_ENV, in_place_store_host(args.local_addr))
    if warm:
        warm_workers.start_forkserver()
        warm_workers.drop_exit_tracebacks()
    try:
        _launch(args, warm)
    except etcd_handler.JobStoppedByAnotherNode as e:  # the job failed elsewhere while this node re-formed
        print(f"[agent] the job stopped without this node: {e}; exit 1", file=sys.stderr, flush=True)
        return 1
    except RendezvousClosedError:  # a hot spare the job finished without (the etcd handler's way to say so)
        print("[agent] hot spare: the job finished without needing this node", file=sys.stderr, flush=True)
        return 0
    except etcd_handler.NodeTakenOut as e:  # a straggler's node, replaced by a hot spare: the job goes on
        print(f"[agent] this node left the job: {e}; a hot spare takes its place", file=sys.stderr, flush=True)
        return 0
    except SignalException as e:
        final_exit = watchdog.final_exit_code() if watchdog is not None else None
        if final_exit is not None:  # the SIGTERM of a worker that stopped with its own exit code
            print(
                f"[agent] training stopped with exit code {final_exit} (see the error above); the worker "
                "group is not restarted: it would stop the same way",
                file=sys.stderr,
                flush=True,
            )
            return final_exit
        sig = signal.Signals(e.sigval)
        print(f"[agent] stopped by {sig.name} (exit {128 + sig})", file=sys.stderr, flush=True)
        return 128 + sig
    except ChildFailedError as e:
        code = e.get_first_failure()[1].exitcode
        if code in KNOWN_EXIT_CODES:  # the worker said what is wrong in one line; a rerun will not help
            print(f"[agent] training stopped with exit code {code} (see the error above)", file=sys.stderr, flush=True)
            return code
        print(e, file=sys.stderr, flush=True)  # a crash: torchrun's summary names the rank and the cause
        return 1
    finally:
        if watchdog is not None:
            watchdog.close()
    return 0


if __name__ == "__main__":
    # Not sys.exit: the agent's workers are stopped and its watchdog closed by now, and finalization would only run
    # the destructors of the C++ threads torch.distributed started here (a standalone agent's TCPStore server),
    # which under load abort the process ("terminate called without an active exception"): a worker's clean
    # "exit 2, bad input" came back as SIGABRT in a full suite run on a busy machine. The workers leave the same way.
    exit_without_finalization(main())

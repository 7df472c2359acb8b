"""The agent of a ``failover.in_place`` job: a worker killed by a signal is replaced alone, the others keep running.

torchrun's ``LocalElasticAgent`` starts a node's workers as one process context and stops every one of them when any
fails (its ``_poll``), then restarts the whole group. :class:`InPlaceAgent` is a ``SimpleElasticAgent`` (torch's
documented extension point: ``_start_workers``, ``_stop_workers``, ``_monitor_workers`` and ``_shutdown`` are the
abstract methods its subclasses implement) that starts each local rank through its own ``start_processes`` call,
with the environment ``LocalElasticAgent`` gives it (torchrun's documented worker variables), so one worker can end
and be started again while its peers run:

* a worker that died of a signal (SIGKILL, the OOM killer, the node watchdog's kill of a wedged worker) is reported
  gone on the job's membership board (``gone/<member>``, the member id the worker gave itself:
  :func:`training.job.failover.member_id`, in the board's scope of the round the agent noted), so its survivors do
  not wait ``gather_s`` for its check-in; then one process is started for its local rank, warm when the job's
  workers are (the same entrypoint and forkserver), with the same environment: it joins the running job
  (docs/inprocess.md). It counts no restart (``--max-restarts``).
* anything else is torchrun's ordinary failure, a full restart of the group counted against ``--max-restarts``, as
  without ``failover.in_place``, said in one ``[agent] in-place:`` line: a worker that exited with a code (e.g. 1
  after its ``falling back to a full restart`` line), two workers lost at once, a second failure while a
  replacement has not joined yet (not in the board's newest epoch), or the replacement's own failure.
* workers that stopped because their node is taken out as a straggler (exit code 8 with the take-out note:
  :mod:`training.job.stragglers`) end the group here: the rendezvous then leaves the job, and the other nodes'
  workers recover in place while a hot spare's take the straggler's ranks.
* a replacement never let in (survivors allowed a smaller world finished first) is stopped once the node's other
  workers ended 0: the job is done.
* a worker left blocked in a collective of an epoch its peers left: once a peer of the newest epoch checked in to
  the next one (its collective failed) and this node's worker has not within ``CUT_AFTER_S`` (0.25 s: survivors
  that are not blocked check in within tens of milliseconds of each other), or at once when a member of its epoch
  was reported lost with its node (by the spare that took its ranks, after its lease ended: a silent node, whose
  peers' collectives cannot end by themselves before their timeout) and no peer checked in, the agent asks it to
  cut its group (``cut-<pid>``, :mod:`training.job.agent_notes`): the worker's in-place watcher aborts the group
  and shuts its connections (:meth:`training.job.inplace.group.InPlaceGroup.cut`; gloo's ``abort()`` alone does
  not end a blocked collective, NCCL's does), its collective fails as on a killed peer and it recovers **in its
  process**. Only if it has not checked in to the next epoch ``cut_grace_s`` (1 s) after the request, and at least
  ``blocked_s`` (1 s) after a peer's check-in or ``lost_blocked_s`` (0.25 s) after the lost node's report, does
  the agent SIGKILL it, say so, and replace it as above (not counted as a second failure): a worker whose cut did
  not end its collective (a backend or a platform without either), or that cannot read the request. On gloo a
  survivor that was not talking to the dead rank can stay blocked on survivors that left for the next epoch:
  their old group stays alive with its connections open after ``destroy_process_group`` (measured with 4 ranks
  on one node, torch 2.13: no Python referrer left, the survivors' agreement ran out of ``in_place_bound_s``
  waiting for the blocked rank and the job fell back to a full restart); the cut ends that too.

Built by :func:`launch` from torchrun's public pieces (``WorkerSpec``, the rendezvous handler from the registry,
``LaunchConfig``) as ``launch_agent`` builds its ``LocalElasticAgent``, and only for ``failover.in_place`` on the
``t5-etcd`` rendezvous (:mod:`training.launch.agent`); every other job runs through ``elastic_launch`` unchanged.
Not carried over from ``LocalElasticAgent`` (none is used by this project): its file-timer watchdog
(``TORCHELASTIC_ENABLE_FILE_TIMER``), health-check server, D-state check and ``virtual_local_rank``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
import uuid
from string import Template
from typing import Any, Callable

from torch.distributed.elastic import events
from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, start_processes
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch.distributed.elastic.utils.store import barrier as store_barrier
from torch.distributed.launcher.api import LaunchConfig

from training.errors import Regroup
from training.job.agent_notes import request_cut, take_out_request
from training.job.lifecycle import process_running
from training.job.startup import SPAWN_TIME_ENV
from training.launch.rendezvous import handler as etcd_handler
from training.launch.worker_exits import WorkerExits

#: Where a line of this agent starts (the agent's other lines say ``[agent]`` too).
PREFIX = "[agent] in-place:"
#: Seconds between two looks at the board for a worker blocked while its peers recover (two reads of the store
#: per node per look, only while the node runs workers); once a peer checked in, every look of the agent's loop;
#: at once when a process or node is reported gone (the agent watches those reports: ``_watch_reports``).
BLOCKED_LOOK_S = 0.25
#: Seconds after a peer checked in to the next epoch before a worker that has not is asked to cut its group
#: (survivors that are not blocked check in within tens of milliseconds of each other).
CUT_AFTER_S = 0.25
#: The key prefix of the agents' exit barrier on their round's store (every agent of an in-place job is an
#: :class:`InPlaceAgent`, so the barrier is theirs: :meth:`InPlaceAgent._exit_barrier`).
EXIT_BARRIER_KEY = "t5f/agents-finished"
#: What torch's monitor loop sleeps between two looks here: the look itself waits the monitor interval, or less
#: when a worker ends (:class:`training.launch.worker_exits.WorkerExits`). torch requires more than 0.
LOOP_SLEEP_S = 0.001


def _say(line: str) -> None:
    print(f"{PREFIX} {line}", file=sys.stderr, flush=True)


def _how(exitcode: int) -> str:
    """``exit code 1`` or ``SIGKILL`` (torch gives a signal as a negative exit code)."""
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class _OneRankLogs(LogsSpecs):
    """The log destinations of one local rank, taken from the group's (reified once per start of the group), as a
    one-process context's: ``start_processes`` wants its ranks numbered from 0."""

    def __init__(self, group: LogsDest, local_rank: int, root: str):
        super().__init__(log_dir=root)
        self.group, self.local_rank = group, local_rank

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        g, r = self.group, self.local_rank
        return LogsDest(
            stdouts={0: g.stdouts[r]},
            stderrs={0: g.stderrs[r]},
            tee_stdouts={0: g.tee_stdouts[r]} if r in g.tee_stdouts else {},
            tee_stderrs={0: g.tee_stderrs[r]} if r in g.tee_stderrs else {},
            error_files={0: g.error_files[r]},
            filtered_stdout=g.filtered_stdout,
            filtered_stderr=g.filtered_stderr,
        )


class InPlaceAgent(SimpleElasticAgent):
    """See the module docstring. ``board_for_round()`` gives the job's membership board in the scope of the round
    just formed (:func:`training.launch.inplace_board.board_from_env`); ``member_id(rank, pid)`` names a worker as
    it names itself (:func:`training.job.failover.member_id`)."""

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs,
        *,
        board_for_round: Callable[[], Any],
        member_id: Callable[[int, int], str],
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        shutdown_timeout: int = 30,
        exit_barrier_timeout: float = 300,
        blocked_s: float = 1.0,
        lost_blocked_s: float = 0.25,
        cut_grace_s: float = 1.0,
        look_s: float = 0.1,
    ):
        super().__init__(spec, exit_barrier_timeout, shutdown_timeout)
        self._look_s = look_s  # the monitor interval: a look waits it, unless a worker ends first
        self._exits = WorkerExits()
        self._exit_barrier_s = exit_barrier_timeout
        self._logs_specs = logs_specs
        self._start_method = start_method
        self._log_line_prefix_template = log_line_prefix_template
        self._board_for_round, self._member_id = board_for_round, member_id
        self._board: Any = None
        self._contexts: dict[int, PContext] = {}  # local rank -> its one process, while it runs
        self._returns: dict[int, Any] = {}  # local rank -> the return value of a worker that finished
        self._launch: dict[int, tuple[tuple, dict[str, str], dict[int, str] | None]] = {}  # args, env, prefix
        self._logs: LogsDest | None = None
        self._joining: dict[int, tuple[int, str]] = {}  # replacements not yet joined: local rank -> rank, member
        self._blocked_s = blocked_s
        self._lost_blocked_s = lost_blocked_s
        self._cut_grace_s = cut_grace_s
        self._cut_asked: dict[str, float] = {}  # member -> when it was asked to cut its group (agent_notes)
        self._blocked_since: dict[str, float] = {}  # member -> when a peer checked in to the next epoch without it
        self._killed_blocked: set[int] = set()  # pids this agent killed for being blocked (replaced, not a failure)
        self._probed: set[tuple[int, int]] = set()  # (epoch, node rank) whose agent was asked after (dead_agent)
        self._next_look = 0.0
        # set by the watch of the board's gone/ reports (its thread): look at blocked workers now, not at _next_look
        self._report_seen = False
        self._gone_watch: Any = None
        self._failed_results = 0  # results returned FAILED: torch's restart count at the group's next start

    # -- the group -------------------------------------------------------------------------------------------------

    def _worker_env(self, worker_group: WorkerGroup, worker, restart_count: int) -> dict[str, str]:
        """What ``LocalElasticAgent._start_workers`` gives a worker (torchrun's documented variables)."""
        spec = worker_group.spec
        env = {
            "RANK": str(worker.global_rank),
            "GROUP_RANK": str(worker_group.group_rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "WORLD_SIZE": str(worker.world_size),
            "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": worker_group.master_addr,
            "MASTER_PORT": str(worker_group.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
            "TORCHELASTIC_USE_AGENT_STORE": str(spec.rdzv_handler.use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1)),
            "LOCAL_RANK": str(worker.local_rank),
        }
        for name in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        self._board = self._board_for_round()  # the round just formed: its workers' in-place scope
        self._watch_reports()
        self._contexts, self._returns, self._joining, self._launch = {}, {}, {}, {}
        self._blocked_since, self._killed_blocked, self._probed, self._cut_asked = {}, set(), set(), {}
        envs = {w.local_rank: self._worker_env(worker_group, w, self._failed_results) for w in worker_group.workers}
        self._logs = self._logs_specs.reify(envs)  # the attempt's log folders once; it sets each error file's path
        for w in worker_group.workers:
            prefix = None
            if self._log_line_prefix_template:
                prefix = Template(self._log_line_prefix_template).safe_substitute(
                    role_name=spec.role, rank=w.global_rank, local_rank=w.local_rank
                )
            args = tuple(str(a).replace("${local_rank}", str(w.local_rank)) for a in spec.args)  # torch's macro
            self._launch[w.local_rank] = (args, envs[w.local_rank], {0: prefix} if prefix else None)
        self._report_previous_holders_gone(
            {w.global_rank for w in worker_group.workers}, worker_group.workers[0].world_size
        )
        return {lr: self._start_one(spec, lr) for lr in self._launch}

    def _watch_reports(self) -> None:
        """Watch the scope's ``gone/`` reports, where the board can (``EtcdBoard.watch_gone``): each one wakes the
        loop and brings the next look at blocked workers forward to now. A silent node's ranks are reported lost by
        the spare that takes them: its peers' agents ask them to cut their group within milliseconds, not at their
        next look (``BLOCKED_LOOK_S``, 0.25 s). Without it (the store away at the start) the looks go on as before."""
        self._stop_watching()
        watch = getattr(self._board, "watch_gone", None)
        if watch is None:
            return
        try:
            self._gone_watch = watch(self._on_report)
        except Exception:  # noqa: BLE001 - the looks still read the reports, at their cadence
            self._gone_watch = None

    def _on_report(self) -> None:
        """The watch's thread: a process or node was reported gone (or the watch resynced)."""
        self._report_seen = True
        self._exits.wake()

    def _stop_watching(self) -> None:
        if self._gone_watch is not None:
            self._gone_watch.stop()
            self._gone_watch = None

    def _report_previous_holders_gone(self, ranks: set[int], world: int) -> None:
        """In a scope whose epoch is running (a round that replaced lost nodes around running survivors: this node
        is a spare taking a lost node's place, or its workers were stopped after all), the members of the newest
        epoch that hold this node's ranks are not running (their node was lost, or this agent stopped them): report
        them gone, so the survivors do not wait for their check-in and this node's workers, joiners, may decide an
        epoch that no old member can (docs/inprocess.md, "A lost node")."""
        try:
            latest = self._board.latest()
            if latest is None or latest.world_size != world:  # (survivors that went on smaller hold other ranks)
                return
            held = [m for m in latest.members if latest.rank(m) in ranks]
            for member in held:
                self._board.report_gone(member, node_lost=True)
        except Exception as e:  # noqa: BLE001 - the store away: the survivors then wait gather_s for them
            _say(
                f"could not report the previous holders of ranks {sorted(ranks)} gone ({' '.join(str(e).split())[:99]})"
            )
            return
        if held:
            _say(
                f"ranks {', '.join(str(latest.rank(m)) for m in held)} of epoch {latest.epoch} were held by workers "
                f"not running now (a lost node's, or stopped): reported gone; this node's workers join that epoch's "
                f"survivors"
            )

    def _start_one(self, spec: WorkerSpec, local_rank: int) -> int:
        """Start the process of ``local_rank`` (the same call for the group's start and a replacement)."""
        args, env, prefixes = self._launch[local_rank]
        env = dict(env)
        if SPAWN_TIME_ENV in env:  # stamped once per group start (training.launch.spawn_time): a replacement's is now
            env[SPAWN_TIME_ENV] = repr(time.time())
        context = start_processes(
            name=spec.role,
            entrypoint=spec.entrypoint,
            args={0: args},
            envs={0: env},
            logs_specs=_OneRankLogs(self._logs, local_rank, self._logs_specs.root_log_dir),
            log_line_prefixes=prefixes,
            start_method=self._start_method,
            numa_options=spec.numa_options,
        )
        self._contexts[local_rank] = context
        return context.pids()[0]

    def kill_workers(self, lost: str) -> list[int]:
        """SIGKILL every worker of this node now and wait (at most 5 s) until they are gone: the rendezvous formed a
        round that does not keep them (its lost node ``lost`` could not be replaced in place: no spare, a stuck
        node), so every worker starts again. The node watchdog's kill finds workers by their heartbeat files, and a
        worker in an in-place recovery has closed its own (its peers' heartbeats went with the old group): torchrun's
        SIGTERM alone waited out its recovery's bound (``failover.in_place_bound_s``) before the new round's
        workers could form their group (``node-loss-rejoin`` with ``failover.in_place``: 9.7 s of 12.0)."""
        pids = [pid for context in self._contexts.values() for pid in context.pids().values()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        while any(process_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        if pids:
            _say(
                f"SIGKILLed worker pid(s) {', '.join(map(str, pids))}: their round lost {lost}, "
                "every worker starts again"
            )
        return pids

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._shutdown(timeout=self._shutdown_timeout)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        for context in self._contexts.values():
            context.close(death_sig, timeout)
        self._contexts = {}
        self._exits.close()
        self._stop_watching()

    def _exit_barrier(self) -> None:
        """Wait, as torch's agent does, for every agent of the round to finish its workers (at most the exit
        barrier's timeout), on the store of the round this node holds its place in *now* (the rendezvous handler's
        ``place_store()``): when rank 0's node was lost and a spare took its place in place, the round's store
        moved to the spare's agent, and the one torchrun got when the workers started went with the lost node
        (waiting there, this agent would fail at once and the new host would wait its whole timeout for it).
        Every agent of an in-place job runs this one, so the barrier's keys are this module's."""
        group = self.get_worker_group()
        handler = group.spec.rdzv_handler
        store = handler.place_store() if hasattr(handler, "place_store") else None
        if store is None:
            super()._exit_barrier()
            return
        began = time.monotonic()
        try:
            store_barrier(store, group.group_world_size, EXIT_BARRIER_KEY, barrier_timeout=self._exit_barrier_s)
        except SignalException:
            raise
        except Exception as e:  # noqa: BLE001 - as torch's: the workers finished; a barrier that failed ends nothing
            _say(
                f"the agents' exit barrier failed after {time.monotonic() - began:.1f} s "
                f"({' '.join(str(e).split())[:160]}); this node's workers finished, so the agent ends"
            )

    # -- watching it -----------------------------------------------------------------------------------------------

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # torch's loop sleeps LOOP_SLEEP_S only: the interval is waited here, cut short by a worker's end, whose
        # replacement the survivors wait for (0-0.1 s saved on every in-place recovery)
        self._exits.wait([pid for c in self._contexts.values() for pid in c.pids().values()], self._look_s)
        by_local = {w.local_rank: w for w in worker_group.workers}
        failed = {}
        for local_rank, context in list(self._contexts.items()):
            result = context.wait(0)
            if result is None:
                continue
            del self._contexts[local_rank]
            if result.is_failed():
                failed[local_rank] = dataclasses.replace(result.failures[0], local_rank=local_rank)
            else:
                self._returns[local_rank] = result.return_values.get(0)
        if failed:
            return self._on_failures(worker_group, by_local, failed)
        self._note_joined()
        if self._joining and set(self._contexts) == set(self._joining) and self._returns:
            self._finished_without_replacement()  # (a node whose only worker is the replacement cannot tell)
        self._kill_blocked(by_local)
        if not self._contexts:
            return RunResult(
                state=WorkerState.SUCCEEDED,
                return_values={by_local[lr].global_rank: v for lr, v in self._returns.items()},
            )
        return RunResult(state=WorkerState.HEALTHY)

    def _note_joined(self) -> None:
        """A replacement counts as joined once the board's newest epoch has it (a failure before falls back)."""
        if not self._joining:
            return
        try:
            latest = self._board.latest()
        except Exception:  # noqa: BLE001 - the store away: ask again at the next look
            return
        for local_rank, (rank, member) in list(self._joining.items()):
            if latest is not None and member in latest.members:
                _say(f"the replacement of rank {rank} joined (epoch {latest.epoch}, world {latest.world_size})")
                del self._joining[local_rank]

    def _finished_without_replacement(self) -> None:
        """Every other worker of this node finished (the job did: its ranks end at the same step) while the
        replacements still wait to be let in (survivors allowed a smaller world go on without them): stop them, as
        hot spares the job finished without, instead of letting their bound fail them into a group restart."""
        for local_rank, (rank, _) in sorted(self._joining.items()):
            self._contexts.pop(local_rank).close(signal.SIGTERM, self._shutdown_timeout)
            self._returns[local_rank] = None
            _say(f"the job finished without needing the replacement of rank {rank}: stopped it")
        self._joining = {}

    def _kill_blocked(self, by_local: dict) -> None:
        """SIGKILL a worker of this node that a peer's recovery left blocked (module docstring): a member of the
        newest epoch, running, that has not checked in to the next one ``blocked_s`` after a peer of its epoch did,
        or ``lost_blocked_s`` after a member of its epoch was reported lost with its node while no peer checked in
        (by the spare that took its ranks, once the lost node's lease ended: a silent node leaves its peers blocked,
        not failed, and their collectives cannot end by themselves before their timeout, so waiting longer keeps
        nothing). Its death is then replaced alone at the next look."""
        now = time.monotonic()
        if (now < self._next_look and not self._report_seen) or self._board is None:
            return
        self._report_seen = False  # before the reads: a report after them sets it again, for another look
        self._next_look = now + BLOCKED_LOOK_S
        try:
            latest = self._board.latest()
            ins = self._board.check_ins(latest.epoch + 1) if latest is not None else {}
        except Exception:  # noqa: BLE001 - the store away: look again later
            return
        peers_in = latest is not None and any(m in latest.members for m in ins)
        try:  # else a member of the newest epoch lost with its node (reported by the spare that took its ranks)
            lost = latest is not None and not peers_in and self._board.lost_with_their_node() & set(latest.members)
        except Exception:  # noqa: BLE001 - the store away: look again later
            return
        if not (peers_in or lost):
            self._blocked_since, self._cut_asked = {}, {}
            return
        self._next_look = now  # a recovery under way: look again at the next turn of the loop
        if peers_in:
            self._take_out_dead_nodes(latest, ins, by_local)
        for local_rank, context in list(self._contexts.items()):
            pid = context.pids()[0]
            member = self._member_id(by_local[local_rank].global_rank, pid)
            if member not in latest.members or member in ins or pid in self._killed_blocked:
                continue  # (a worker killed already is replaced once the loop sees it end)
            since = self._blocked_since.setdefault(member, now)
            rank, why = by_local[local_rank].global_rank, "its peers left it" if peers_in else "a node was lost"
            if member not in self._cut_asked and now - since >= (CUT_AFTER_S if peers_in else 0.0):
                self._ask_to_cut(member, pid, rank, latest.epoch, now - since, why, now)
            bound = self._blocked_s if peers_in else self._lost_blocked_s
            if member in self._cut_asked:  # give its cut the time to end the collective and check in
                bound = max(bound, self._cut_asked[member] - since + self._cut_grace_s)
            if now - since < bound:
                continue
            self._killed_blocked.add(pid)
            _say(
                f"worker rank {by_local[local_rank].global_rank} (pid {pid}) has not checked in to epoch "
                f"{latest.epoch + 1} {now - since:.1f} s after {'its peers did' if peers_in else 'a node was lost'}"
                " (blocked in a collective its backend cannot cut): killed, to be replaced"
            )
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _ask_to_cut(self, member: str, pid: int, rank: int, epoch: int, waited: float, why: str, now: float) -> None:
        """Ask the worker to cut its group of ``epoch`` (:func:`training.job.agent_notes.request_cut`): its
        in-place watcher shuts the group's connections, its collective fails and it recovers in its process; it
        is killed only if it has not checked in ``cut_grace_s`` later."""
        if request_cut(pid, epoch, f"{why}: epoch {epoch + 1} is forming without it"):
            self._cut_asked[member] = now
            _say(
                f"worker rank {rank} (pid {pid}) still in epoch {epoch} {waited:.1f} s after {why}: asked it to cut "
                f"its group (killed if it has not checked in to epoch {epoch + 1} {self._cut_grace_s:g} s later)"
            )

    def _take_out_dead_nodes(self, latest, ins: dict, by_local: dict) -> None:
        """A peer checked in to the next epoch (its collective failed) while members on other nodes have not and
        were not reported gone: ask the rendezvous whether each such node's agent is dead, once per node and
        epoch. A dead one's lease is revoked there (:mod:`training.launch.rendezvous.dead_agent`), so its hot
        spare comes in now instead of after the lease's TTL; a live one (its worker killed alone, or blocked) is
        left to its own agent and to the rules above."""
        take_out = getattr(self._worker_group.spec.rdzv_handler, "take_out_if_dead", None)
        if take_out is None:
            return
        mine = {w.global_rank for w in by_local.values()}
        local_world = self._worker_group.spec.local_world_size
        try:
            gone = self._board.gone()
        except Exception:  # noqa: BLE001 - the store away: look again later
            return
        for member in latest.members:
            rank = latest.rank(member)
            node = (latest.epoch, rank // local_world)
            if member in ins or member in gone or rank in mine or node in self._probed:
                continue
            self._probed.add(node)
            line = take_out(node[1])
            if line:
                _say(line)

    def _on_failures(self, worker_group: WorkerGroup, by_local: dict, failed: dict) -> RunResult:
        """Replace a lone worker killed by a signal, and the workers this agent killed for being blocked; anything
        else is the group's ordinary failure (restart)."""
        ranks = {by_local[lr].global_rank: f for lr, f in failed.items()}
        outside = {r: f.exitcode for r, f in ranks.items() if f.pid not in self._killed_blocked}
        if outside and set(outside.values()) == {Regroup.exit_code} and take_out_request() is not None:
            self._failed_results += 1  # torch's loop then rendezvous again, which this node leaves (NodeTakenOut)
            _say(
                f"worker(s) {', '.join(f'rank {r}' for r in sorted(outside))} stopped as this node is taken out as a "
                "straggler: it leaves the job, a hot spare's workers take its ranks, the others' recover in place"
            )
            return RunResult(state=WorkerState.FAILED, failures=ranks)
        joining = {rank for rank, _ in self._joining.values()}
        why = full_restart_reason(outside, joining) if outside else ""
        if why:
            self._failed_results += 1
            _say(f"{why}: full restart of the worker group (counted against --max-restarts)")
            return RunResult(state=WorkerState.FAILED, failures=ranks)
        for local_rank, failure in sorted(failed.items()):
            self._replace(worker_group, by_local[local_rank], local_rank, failure)
        return RunResult(state=WorkerState.HEALTHY)

    def _replace(self, worker_group: WorkerGroup, worker, local_rank: int, failure) -> None:
        """Report ``worker`` gone and start one process for its local rank, which joins the running job."""
        self._killed_blocked.discard(failure.pid)
        member = self._member_id(worker.global_rank, failure.pid)
        reported = "reported gone"
        try:
            self._board.report_gone(member)
        except Exception as e:  # noqa: BLE001 - the survivors then wait gather_s for its check-in
            reported = f"not reported gone ({' '.join(str(e).split())[:120]})"
        worker.id = self._start_one(worker_group.spec, local_rank)
        self._joining[local_rank] = (worker.global_rank, self._member_id(worker.global_rank, worker.id))
        _say(
            f"worker rank {worker.global_rank} (local rank {local_rank}, pid {failure.pid}) died of "
            f"{_how(failure.exitcode)}: {reported}, its replacement started (pid {worker.id}); the other workers "
            "keep their processes"
        )


def full_restart_reason(exits: dict[int, int], joining: set[int] | int | None) -> str:
    """Why workers that ended together cannot be recovered in place, "" when they can (one worker, killed by a
    signal, no replacement joining). ``exits``: global rank -> exit code (negative: the signal, as torch gives it);
    ``joining``: the ranks whose replacements have not joined yet (one rank, or None: none)."""
    named = ", ".join(f"rank {r} ({_how(code)})" for r, code in sorted(exits.items()))
    pending = sorted({joining} if isinstance(joining, int) else joining or ())
    if pending:
        failed = [r for r in pending if r in exits]
        if failed:
            return f"the replacement of rank {failed[0]} failed ({_how(exits[failed[0]])})"
        return f"{named} failed while the replacement of rank {', '.join(map(str, pending))} was joining"
    if len(exits) > 1:
        return f"{len(exits)} workers failed at once: {named}"
    if min(exits.values()) >= 0:
        return f"worker {named} ended by itself (after its in-place recovery fell back, or an error)"
    return ""


def launch(
    config: LaunchConfig,
    entrypoint: Callable | str,
    args: list[Any],
    *,
    board_for_round: Callable[[], Any],
    member_id: Callable[[int, int], str],
    blocked_s: float = 1.0,
    lost_blocked_s: float = 0.25,
) -> dict[int, Any]:
    """Run an :class:`InPlaceAgent` as torch's ``launch_agent`` runs its ``LocalElasticAgent`` (the rendezvous
    handler from the registry, the worker spec from ``config``; ``ChildFailedError`` when the workers failed for
    good; the rendezvous shut down unless a signal stopped the agent). Returns the workers' return values by
    global rank. ``blocked_s``, ``lost_blocked_s``: how long a blocked worker is waited for (:class:`InPlaceAgent`)."""
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **{**config.rdzv_configs, "in_place": True},  # a lost node's round may keep the survivors' workers
    )
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle  # read by each context's start
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(args),
        rdzv_handler=get_rendezvous_handler(params),
        max_restarts=config.max_restarts,
        monitor_interval=LOOP_SLEEP_S,  # the interval is the agent's look (look_s)
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
    )
    agent = InPlaceAgent(
        spec,
        config.logs_specs,
        board_for_round=board_for_round,
        member_id=member_id,
        start_method=config.start_method,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=config.shutdown_timeout,
        blocked_s=blocked_s,
        lost_blocked_s=lost_blocked_s,
        look_s=config.monitor_interval,
    )
    shutdown_rdzv = True
    forget_on_lost = etcd_handler.add_on_lost(agent.kill_workers)
    try:
        result = agent.run()
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        if result.is_failed():
            name = entrypoint.__name__ if callable(entrypoint) else str(entrypoint)
            raise ChildFailedError(name=name, failures=result.failures)
        return result.return_values
    except ChildFailedError:
        raise
    except SignalException:
        shutdown_rdzv = False  # as torch: a signalled agent leaves the rendezvous open for the job's other nodes
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except Exception:
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    finally:
        forget_on_lost()
        if shutdown_rdzv:
            spec.rdzv_handler.shutdown()

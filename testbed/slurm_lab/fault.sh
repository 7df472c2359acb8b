#!/usr/bin/env bash
# fault.sh: inject failures into the lab. NODE is n1..nN.
#   kill-node NODE      power loss: SIGKILL every process of the node (slurmd, slurmstepd, job tasks,
#                       torchrun agents and workers) and, in netns mode, unplug its link. slurmctld notices
#                       by itself (NOT_RESPONDING after ~SlurmdTimeout, DOWN and job requeue after ~2x).
#   revive NODE         power back on: wait until Slurm has marked a killed node DOWN (reviving earlier
#                       leaves its lost job steps unnoticed and the job hangs), plug the link, restart
#                       slurmd, then return the node to service safely (see below).
#   cut-link NODE       network partition (netns mode only): take the node's link down; its processes keep
#                       running, silent to everyone (no socket is closed). slurmctld marks it DOWN as for
#                       kill-node; revive fences it first (SIGKILL of everything on it, as a reboot would).
#   kill-workers NODE   SIGKILL only the training worker processes (named t5f-rank-N, under the torchrun agent) on
#                       the node: the agent restarts its worker group inside the allocation.
#   kill-tasks NODE     SIGKILL every srun-launched task on the node (agent and workers); the batch script
#                       and its srun survive.
#   slow NODE [PERCENT] a slow node, not a stopped one (a throttled CPU, a noisy neighbour): every process of the
#                       node, slurmd included (what it starts later inherits it), goes into a CPU cgroup limited to
#                       PERCENT (default 33) of one CPU over 10 ms periods and to PERCENT of a node's CPU weight (the
#                       other nodes get cgroups at full weight: on a busy machine the quota alone would not bind);
#                       its heartbeats and keep-alives still run.
#                       Needs the cpu cgroup controller (v1, or v2 with cpu delegated); the kernel's netem would slow
#                       the link instead, but it is often absent (no sch_netem, no modprobe): `can-slow` says which.
#   unslow NODE         full speed again: its processes back to the root cgroup, the node's cgroup removed (the
#                       other nodes' too once no node is slow)
#   can-slow            exit 0 (printing the cgroup controller) when `slow` works here, else 1 with the reason
#   pids NODE | state NODE | link NODE (UP, DOWN; none on loopback) | wait NODE REGEX [TIMEOUT_S]
#   store kill-leader   SIGKILL the etcd member that leads now (the membership store: 3 members off the nodes)
#   store stop          SIGTERM every etcd member (an outage of the whole store; its data stays; the leader's
#                       graceful stop waits ~5 s for a leadership transfer that cannot happen)
#   store kill-all      SIGKILL every etcd member (all their hosts lost at once; the data on disk stays)
#   store start         start the stopped members again with their data, wait until they elect a leader
#   store leader | store pids | store health   (leader: the member that leads, once one does)
# "Safe return to service": a node that slurmctld marked DOWN is brought back DRAINed; we wait until it
# responds and its stale steps are gone, wait >1 s, then RESUME it. Without this a requeued job (same job
# id) can land on it in the second in which slurmd revokes the old incarnation's credential, and the
# launch fails with "Job credential revoked".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cmd="${1:-}"; n="${2:-}"
usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }
case "$cmd" in -h|--help|help|"") usage; exit 0 ;; esac
if [[ "$cmd" == store ]]; then   # the membership store is no node's: testbed/slurm_lab/etcd.py acts on it
  [[ -s "$R/etcd/state.json" ]] || die "the lab at $R runs no etcd (run: scripts/slurm_lab.sh up)"
  case "$n" in
    kill-leader) m="$(etcd_ctl kill leader)" && echo "$m" && log "SIGKILLed the etcd leader: $m" ;;
    stop)        m="$(etcd_ctl stop all)" && echo "$m" && log "stopped every etcd member: $m" ;;
    kill-all)    m="$(etcd_ctl kill all)" && echo "$m" && log "SIGKILLed every etcd member: $m" ;;
    start)       etcd_ctl restart all >/dev/null && etcd_ctl health --timeout 30 >/dev/null && log "etcd members back: $(etcd_ctl pids)" ;;
    leader)      etcd_ctl leader --timeout 10 ;;   # once one leads: an election takes about a second
    pids|health) etcd_ctl "$n" ;;
    *) usage >&2; die "store ${n:-(nothing)}: use kill-leader, kill-all, stop, start, leader, pids or health" ;;
  esac
  exit
fi
if [[ "$cmd" == can-slow ]]; then cpu_cgroup_root; exit; fi
[[ -n "$n" ]] || { usage >&2; die "$cmd: missing NODE"; }
i="$(node_idx "$n")"
(( i >= 1 && i <= SLAB_NODES )) || die "no node $n in this lab (nodes n1..n$SLAB_NODES)"
[[ -s "$R/run/mode" ]] || die "the lab at $R is not up (run: scripts/slurm_lab.sh up)"

slurmd_pid() { pidfile_pid "$R/run/slurmd-$n.pid"; }
stale_pids() { local sp; sp="$(slurmd_pid)"; node_pids_alive "$n" | grep -vx "${sp:-x}" || true; }
# node PIDs of training workers: they name themselves t5f-rank-N (training.job.lifecycle.name_worker); a warm
# worker, forked by its agent's forkserver, has no torchrun variables in /proc/PID/environ
node_worker_pids() {
  local p
  for p in $(node_pids_alive "$n"); do [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == t5f-rank-* ]] && echo "$p"; done
  return 0
}
kill9() { (($#)) && kill -9 "$@" 2>/dev/null || true; }

safe_resume() {   # $1 = "drained" when we drained the node before bringing it back
  local t=$SECONDS st
  while st="$(node_state "$n")"; [[ "$st" == *NOT_RESPONDING* || "$st" == DOWN* ]]; do
    (( SECONDS - t > 30 )) && die "$n still $st 30 s after restart"
    sleep 0.2
  done
  if [[ "${1:-}" == drained ]]; then
    t=$SECONDS
    while [[ -n "$(stale_pids)" ]] && (( SECONDS - t < 15 )); do sleep 0.2; done
    sleep 1.2
    scontrol update NodeName="$n" State=RESUME
  fi
  wait_nodes 'idle|alloc|mix|comp' 30 "$n"
}

case "$cmd" in
  pids)  node_pids_alive "$n" ;;
  state) node_state "$n" ;;
  link)
    if [[ "$(cur_mode)" != netns ]]; then echo none
    elif ip -o link show "${SLAB_PFX}-h$i" | grep -q '<[^>]*\bUP\b'; then echo UP
    else echo DOWN; fi ;;
  wait)  wait_nodes "${3:?usage: wait NODE REGEX [TIMEOUT_S]}" "${4:-30}" "$n" ;;
  kill-node)
    if [[ "$(cur_mode)" == netns ]]; then ip link set "${SLAB_PFX}-h$i" down; fi
    p=$(node_pids_alive "$n" | tr '\n' ' ')
    kill9 $p
    p2=$(node_pids_alive "$n" | tr '\n' ' ')   # children forked while we were killing
    kill9 $p2
    touch "$R/run/killed-$n"
    log "killed node $n: pids $p$p2" ;;
  cut-link)
    [[ "$(cur_mode)" == netns ]] || die "cut-link needs the lab in netns mode (this one runs on loopback)"
    ip link set "${SLAB_PFX}-h$i" down
    touch "$R/run/killed-$n" "$R/run/cut-$n"
    log "cut the link of $n (${SLAB_PFX}-h$i down); its processes keep running: $(node_pids_alive "$n" | wc -l)" ;;
  revive)
    if [[ -e "$R/run/cut-$n" ]]; then   # a partitioned node is fenced before it rejoins: nothing stale writes
      kill9 $(node_pids_alive "$n" | tr '\n' ' ')
      rm -f "$R/run/cut-$n"
    fi
    if [[ -e "$R/run/killed-$n" ]]; then
      wait_nodes 'down\*?|drain\*?|drng\*?' $((4 * SLAB_SLURMD_TIMEOUT + 20)) "$n" || true
      rm -f "$R/run/killed-$n"
    fi
    drained=""
    if [[ "$(node_state "$n")" == DOWN* ]]; then
      scontrol update NodeName="$n" State=DRAIN Reason=slab-revive; drained=drained
    fi
    if [[ "$(cur_mode)" == netns ]]; then ip link set "${SLAB_PFX}-h$i" up; fi
    p=$(slurmd_pid); if pid_alive "$p"; then kill -9 "$p"; sleep 0.2; fi
    drop_node_cgroup "$i"   # a node that was slowed comes back at full speed
    start_slurmd "$i"
    safe_resume "$drained"
    log "revived $n ($(node_state "$n"))" ;;
  slow)
    pct="${3:-33}"
    [[ "$pct" =~ ^[0-9]+$ ]] && (( pct >= 1 && pct <= 100 )) || die "slow $n $pct: PERCENT must be 1..100 (of one CPU)"
    root="$(cpu_cgroup_root)" || die "cannot slow $n here: $(cpu_cgroup_root 2>&1)"
    [[ -n "$(node_pids_alive "$n")" ]] || die "no process on $n to slow"
    # every node in a cgroup of its own, as machines have their own CPUs: the others at full weight, this one at
    # PERCENT of it and of one CPU; this node first, so that the slowdown starts as soon as it can
    cg="$(node_cgroup "$root" "$i")"
    mkdir -p "$cg"
    set_node_cpu "$cg" "$pct"
    move_node_to_cgroup "$cg" "$i" 3
    for ((k = 1; k <= SLAB_NODES; k++)); do
      kg="$(node_cgroup "$root" "$k")"
      (( k == i )) || [[ -d "$kg" ]] && continue   # a node already in its cgroup stays there (slow or not)
      mkdir -p "$kg"
      set_node_cpu "$kg" 100
      move_node_to_cgroup "$kg" "$k" 1
    done
    echo "$pct" > "$R/run/slow-$n"
    echo "$cg $(wc -l < "$cg/cgroup.procs")"
    log "slowed $n to $pct% of one CPU (cgroup $cg): $(wc -l < "$cg/cgroup.procs") processes" ;;
  unslow)
    drop_node_cgroup "$i"
    if ! compgen -G "$R/run/slow-n*" >/dev/null; then   # nobody slow: the other nodes' cgroups go too
      for ((k = 1; k <= SLAB_NODES; k++)); do drop_node_cgroup "$k"; done
    fi
    log "$n at full speed again" ;;
  kill-workers)
    p=$(node_worker_pids | tr '\n' ' ')
    [[ -n "$p" ]] || die "no torchrun worker processes on $n"
    kill9 $p
    log "killed training workers on $n: $p" ;;
  kill-tasks)
    # srun-launched tasks carry a numeric SLURM_STEP_ID; the batch script (step "batch") is spared
    p=$(for q in $(node_pids_alive "$n"); do
          if grep -qzE '^SLURM_STEP_ID=[0-9]+$' "/proc/$q/environ" 2>/dev/null; then echo "$q"; fi; done | tr '\n' ' ')
    [[ -n "$p" ]] || die "no srun task processes on $n"
    kill9 $p
    log "killed srun tasks on $n: $p" ;;
  *) usage >&2; die "unknown command '$cmd'" ;;
esac

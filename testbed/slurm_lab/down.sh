#!/usr/bin/env bash
# down.sh: stop the lab started by up.sh: only its own processes (by PID file, namespace membership and
# node tag), then its namespaces and links (by prefix). Safe to run repeatedly or when nothing is up.
# Keeps $SLAB_ROOT/shared (job outputs) and the last logs in $SLAB_ROOT/log.prev.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pids=()
add() {
  local p
  for p in "$@"; do
    [[ "$p" =~ ^[0-9]+$ && "$p" != "$$" ]] && pid_alive "$p" && [[ " ${pids[*]} " != *" $p "* ]] && pids+=("$p")
  done
}
# nodes first (slurmd, slurmstepd, job tasks), then the controller and its slurmscriptd, then munge
for ((i = 1; i <= SLAB_NODES; i++)); do add $(node_pids "n$i"); done
ctld="$(pidfile_pid "$R/run/slurmctld.pid")"
add "$ctld"
[[ -n "$ctld" ]] && add $(ps -o pid= --ppid "$ctld" 2>/dev/null)
add "$(pidfile_pid "$R/run/munged.pid")"
add $(store_pids)   # the etcd members (PIDs in $R/etcd/state.json; our_daemons finds them by tag too)
add $(our_daemons)   # when PID files are gone or stale

if ((${#pids[@]})); then
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 1 25); do
    alive=()
    for p in "${pids[@]}"; do pid_alive "$p" && alive+=("$p"); done
    ((${#alive[@]})) || break
    sleep 0.2
  done
  ((${#alive[@]})) && kill -KILL "${alive[@]}" 2>/dev/null
fi

for ((i = 1; i <= SLAB_NODES; i++)); do drop_node_cgroup "$i"; done   # the CPU cgroups of slowed nodes

# namespaces and links of this lab only (prefix), also when $R is already gone
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${SLAB_PFX}-(n[0-9]+|probe)\$"); do
  ip netns del "$ns" 2>/dev/null
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${SLAB_PFX}-(h[0-9]+|br)\$"); do
  ip link del "$l" 2>/dev/null
done

if [[ -d "$R" ]]; then
  rm -rf "$R/log.prev"; [[ -d "$R/log" ]] && mv "$R/log" "$R/log.prev"
  rm -rf "$R/run" "$R/state" "$R/etc" "$R/etcd" "$R/env.sh" "$R/lab.env"
fi
echo "slurm lab down: stopped ${#pids[@]} processes"

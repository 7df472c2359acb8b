#!/usr/bin/env bash
# status.sh: what the lab is doing: daemons, nodes, jobs. Exit 0 when up and every node is usable, 1 otherwise.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ ! -s "$R/run/mode" ]]; then echo "slurm lab: down (root $R)"; exit 1; fi
ok=0
show() { if pid_alive "$2"; then printf '  %-10s pid %s\n' "$1" "$2"; else printf '  %-10s NOT RUNNING\n' "$1"; ok=1; fi; }
echo "slurm lab: $(cat "$R/run/settings" 2>/dev/null || echo 'starting or failed')"
echo "  root $R   SLURM_CONF=$CONF   shared dir $R/shared"
show munged "$(pidfile_pid "$R/run/munged.pid")"
show slurmctld "$(pidfile_pid "$R/run/slurmctld.pid")"
n=0; for p in $(store_pids); do show "etcd m$n" "$p"; n=$((n + 1)); done
((n == 3)) || { printf '  %-10s %s of 3 members running\n' etcd "$n"; ok=1; }
for ((i = 1; i <= SLAB_NODES; i++)); do show "slurmd n$i" "$(pidfile_pid "$R/run/slurmd-n$i.pid")"; done
echo "nodes:"; timeout 10 sinfo -N -o '  %N %t %c %E' 2>/dev/null || { echo "  (slurmctld not answering)"; ok=1; }
echo "jobs:";  timeout 10 squeue -t all -o '  %i %j %T %M %R' 2>/dev/null || true
st="$(timeout 10 sinfo -h -N -o '%t' 2>/dev/null)"
[[ -n "$st" ]] && ! grep -qvE '^(idle|alloc|mix|comp)$' <<<"$st" || ok=1
exit $ok

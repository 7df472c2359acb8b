#!/usr/bin/env bash
# slurm_lab.sh: the project's local Slurm test cluster (real slurmctld + one slurmd per node on this machine).
#   scripts/slurm_lab.sh up       start it (installs Debian's Slurm 22.05 + munge if missing); idempotent
#   scripts/slurm_lab.sh down     stop it (only its own processes, namespaces and links)
#   scripts/slurm_lab.sh status   daemons, nodes, jobs (exit 1 when not up/healthy)
#   scripts/slurm_lab.sh env      print `export SLURM_CONF=...` and root's `T5_ETCD_*` lines:  eval "$(scripts/slurm_lab.sh env)"
#   scripts/slurm_lab.sh fault kill-node|revive|kill-workers|kill-tasks|state|pids|wait NODE ...
#   scripts/slurm_lab.sh fault store kill-leader|kill-all|stop|start|leader|pids|health   (the lab's 3 etcd members)
# Settings (environment): NODES (or SLAB_NODES, default 2), SLAB_MODE=auto|netns|loopback,
# SLAB_ROOT (default <repo>/.slurm-lab), SLAB_PFX, SLAB_NET, SLAB_CTLD_PORT, SLAB_SLURMD_PORT.
# Needs root. See docs/slurm.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lab="$root/testbed/slurm_lab"
export SLAB_ROOT="${SLAB_ROOT:-$root/.slurm-lab}"
[[ -n "${NODES:-}" && -z "${SLAB_NODES:-}" ]] && export SLAB_NODES="$NODES"
cmd="${1:-help}"; shift || true
case "$cmd" in
  up)     exec "$lab/up.sh" "$@" ;;
  down)   exec "$lab/down.sh" "$@" ;;
  status) exec "$lab/status.sh" "$@" ;;
  fault)  exec "$lab/fault.sh" "$@" ;;
  env)    [[ -s "$SLAB_ROOT/env.sh" ]] || { echo "slurm lab is not up (scripts/slurm_lab.sh up)" >&2; exit 1; }
          cat "$SLAB_ROOT/env.sh" ;;
  -h|--help|help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "slurm_lab.sh: unknown command '$cmd' (up|down|status|env|fault; --help)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# make chaos-test: kill workers and nodes of a running job and prove nothing is lost.
#   PLATFORM=local (default)  simulated nodes on this machine (python -m chaos.local)
#   PLATFORM=slurm            scripts/chaos_slurm.sh (a real Slurm cluster)
#   PLATFORM=eks              scripts/chaos_eks.sh (Kubernetes)
# Local variables: NODES (default 2), NPROC (per node, default 1), PRESET (default debug), DRY_RUN=1 (or
# true/yes/on) prints the plan and one agent's command. Extra arguments go to python -m chaos.local, e.g.
#   make chaos-test ARGS="--scenarios hang,silent-node"   (python -m chaos.local --help lists all options)
#   make chaos-test ARGS="-- --model.num_layers 2"        training flags for every job (checked before any runs)
#   make chaos-test SOAK=10m   goodput soak: one random fault per minute, against an uninterrupted run
# SPARES sets the soak's hot spares (default 1); the scenarios choose their own, so they refuse a non-zero SPARES.
# Writes .chaos/runs/<time>/report.json and timeline.png (.chaos/last points at the newest run).
set -euo pipefail
cd "$(dirname "$0")/.."
platform="${PLATFORM:-local}"
delegate() {  # the cluster variants live with the Slurm / Kubernetes work
  [ -x "$1" ] || { echo "error: PLATFORM=$platform needs $1, which is not in this checkout" >&2; exit 2; }
  exec "$@"
}
case "$platform" in
  local) ;;
  slurm|parallelcluster) delegate scripts/chaos_slurm.sh "$@" ;;
  eks) delegate scripts/chaos_eks.sh "$@" ;;
  *) echo "error: PLATFORM=$platform is not one of: local, slurm, eks" >&2; exit 2 ;;
esac
for v in NODES NPROC; do
  val="${!v:-}"
  if [ -n "$val" ] && ! [[ "$val" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: $v=$val must be a positive integer" >&2; exit 2
  fi
done
spares="${SPARES:-0}"  # chaos.local says what it means for the scenarios and the soak
[[ "$spares" =~ ^[0-9]+$ ]] || { echo "error: SPARES=$spares must be 0 or a positive integer (hot-spare nodes)" >&2; exit 2; }
py=$(scripts/venv.sh)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
dry=$("$py" -m tools.env_flags DRY_RUN) || exit 2  # 1/true/yes/on, 0/false/no/off/empty, else exit 2
if [ "$dry" = true ]; then
  exec "$py" -m chaos.local --dry-run "$@"
fi
exec "$py" -m chaos.local "$@"

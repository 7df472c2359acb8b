#!/usr/bin/env bash
# make status: one screen for the running or last training job (python -m tools.status --help).
#   local (default)          the run directory make train uses (PRESET, and ARGS as given to make train, e.g.
#                            ARGS="--job.out_dir runs/x"), or ARGS=RUN_DIR itself; running while the job holds its
#                            checkpoint directory
#   slurm | parallelcluster  squeue's job named RUN_NAME (default: PRESET) and its run directory on the shared
#                            file system (SHARED_DIR, /fsx, or the local Slurm lab's)
#   eks                      the TrainJob JOB_NAME (NAMESPACE, default "training": where make train submits): its status, pods and metrics
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
platform="${PLATFORM:-local}"
case "$platform" in
  local)
    # ARGS=runs/x: the run directory itself (what tools.status takes before --), not a training argument
    if [[ $# -gt 0 && "$1" != -* ]]; then
      if [[ $# -gt 1 ]]; then
        echo "error: ARGS=\"$*\": give the run directory alone (ARGS=$1) or training arguments" \
             "(ARGS=\"--job.out_dir $1 ...\"), not both" >&2
        exit 2
      fi
      exec "$py" -m tools.status --platform local "$1"
    fi
    # the training arguments make train would get: PRESET unless a --preset is among them
    preset_args=(--preset "${PRESET:-debug}")
    for a in "$@"; do case "$a" in --preset|--preset=*) preset_args=() ;; esac; done
    exec "$py" -m tools.status --platform local -- "${preset_args[@]}" "$@" ;;
  slurm|parallelcluster|eks) exec "$py" -m tools.status --platform "$platform" "$@" ;;
  *) echo "error: PLATFORM=$platform is not one of: local, slurm, parallelcluster, eks" >&2; exit 2 ;;
esac

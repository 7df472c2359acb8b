#!/usr/bin/env bash
# make chaos-test PLATFORM=slurm: kill a node, kill training processes, send the pre-timeout signal on a real
# Slurm cluster (the local lab, brought up if needed) and prove the final weights are bitwise equal to an
# uninterrupted run. Arguments go to python -m chaos.slurm (--help); NODES and SPARES are its --nodes and --spares
# unless those are given. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
dry=$("$py" -m tools.env_flags DRY_RUN) || exit 2
if [ "$dry" = true ]; then  # chaos.slurm has no plan-only mode: refuse rather than start a lab and kill nodes
  echo "error: DRY_RUN=$DRY_RUN: the Slurm chaos test has no dry run (it starts the local lab and kills its nodes);" \
       "see its scenarios with 'scripts/chaos_slurm.sh --help', then run it without DRY_RUN" >&2
  exit 2
fi
exec "$py" -m chaos.slurm "$@"

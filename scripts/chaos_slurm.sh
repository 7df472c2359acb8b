#!/usr/bin/env bash
# make chaos-test PLATFORM=slurm: kill a node, kill training processes, send the pre-timeout signal on a real
# Slurm cluster (the local lab, brought up if needed) and prove the final weights are bitwise equal to an
# uninterrupted run. Arguments go to python -m chaos.slurm (--help). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
exec "$py" -m chaos.slurm "$@"

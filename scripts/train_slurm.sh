#!/usr/bin/env bash
# make train PLATFORM=slurm: render the batch script, sbatch it from this head/login node, print the job id,
# follow the log and report the final state. Arguments: job options (--nodes, --time, --instance-type,
# --run-name, --shared-dir, --no-follow, --dry-run, ...; see --help) and training flags (--train.steps 100 ...).
# Works against the local lab after `make slurm-up` without further setup. Exit 0 = job completed.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
exec "$py" -m tools.slurm.submit "$@"

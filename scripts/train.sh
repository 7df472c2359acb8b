#!/usr/bin/env bash
# make train: run the FSDP2 T5 job. PLATFORM picks where:
#   local (default)          torchrun --standalone on this machine (PRESET=debug, NPROC=2); Ctrl-C saves a
#                            checkpoint at the next step and stops (twice: stops at once)
#   slurm | parallelcluster  sbatch on a Slurm cluster (scripts/train_slurm.sh)
#   eks                      a Kubeflow TrainJob (scripts/train_eks.sh; DRY_RUN=1 prints the YAML)
# Extra arguments go to the training CLI (python -m training --help), e.g.
#   make train ARGS="--train.steps 100 --checkpoint.interval 20"
set -euo pipefail
cd "$(dirname "$0")/.."
platform="${PLATFORM:-local}"
case "$platform" in
  local) ;;
  slurm|parallelcluster) exec scripts/train_slurm.sh "$@" ;;
  eks) exec scripts/train_eks.sh "$@" ;;
  *) echo "error: PLATFORM=$platform is not one of: local, slurm, parallelcluster, eks" >&2; exit 2 ;;
esac
py=$(scripts/venv.sh)
preset="${PRESET:-debug}"
nproc="${NPROC:-2}"
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || { echo "error: NPROC=$nproc must be a positive integer" >&2; exit 2; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "[train] local run: preset=$preset, $nproc processes (torchrun --standalone, gloo on CPU)"
set +e
# torchrun's agent through training.launch.agent: one line instead of tracebacks on Ctrl-C, workers die with it
"$py" -m training.launch.agent --standalone --nproc_per_node="$nproc" -m training --preset "$preset" "$@"
rc=$?
set -e
case $rc in
  0) ;;
  130|143) echo "[train] stopped at a checkpoint; make train resumes" >&2 ;;
  7) ;;  # checkpoint.dir in use by another run: the error line above names it and the fix
  *) echo "[train] failed with exit code $rc (run 'make train' again to resume from the last complete checkpoint)" >&2 ;;
esac
exit $rc

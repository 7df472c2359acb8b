#!/usr/bin/env bash
# make train: run the FSDP2 T5 job. PLATFORM picks where:
#   local (default)          torchrun --standalone on this machine (PRESET=debug, NPROC=2); NODES=N > 1 runs N
#                            simulated nodes (python -m training.launch); DRY_RUN=1 prints the command
#                            Ctrl-C saves a checkpoint at the next step and stops (twice: stops at once); a worker
#                            that dies is restarted from the in-memory snapshot, at most MAX_RESTARTS times (3)
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
preset_args=(--preset "$preset")
# A --preset among the arguments wins over PRESET: the banner says that one, and it is passed once.
prev=""
for a in "$@"; do
  case "$a" in --preset=*) preset="${a#--preset=}"; preset_args=() ;; esac
  [ "$prev" = --preset ] && { preset="$a"; preset_args=(); }
  prev="$a"
done
nproc="${NPROC:-2}"
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || { echo "error: NPROC=$nproc must be a positive integer" >&2; exit 2; }
max_restarts="${MAX_RESTARTS:-3}"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || { echo "error: MAX_RESTARTS=$max_restarts must be 0 or a positive integer (worker-group restarts)" >&2; exit 2; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# NODES and DRY_RUN (read the same way on every platform): NODES > 1 simulates that many nodes on this machine
# with the launcher the clusters use; DRY_RUN=1 prints the command(s) instead of running them.
nodes="${NODES:-1}"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { echo "error: NODES=$nodes must be a positive integer (simulated nodes here)" >&2; exit 2; }
spares="${SPARES:-0}"
[[ "$spares" =~ ^[0-9]+$ ]] || { echo "error: SPARES=$spares must be 0 or a positive integer (hot-spare nodes)" >&2; exit 2; }
dry=$("$py" -m tools.env_flags DRY_RUN) || exit 2
# The run's goodput so far, in one line (python -m training.goodput RUN_DIR prints the whole ledger): after any
# attempt that trained, i.e. not after a refusal before the first step (bad settings, a busy directory).
goodput_line() {  # RC ARGS...: the run's exit code, then the training arguments
  case $1 in
    2|3|4|7) ;;
    *) "$py" -m training.goodput --summary -- "${preset_args[@]}" "${@:2}" 2>/dev/null || true ;;
  esac
}
# After a stop: where a rerun resumes, or that it starts afresh (a stop can come before the first checkpoint), in
# the line make's exit line points at (scripts/train_exit.sh).
resume_line() {  # RC ARGS...
  case $1 in
    130|138|143) echo "[train] $("$py" -m tools.resume_point "${preset_args[@]}" "${@:2}" 2>/dev/null || echo stopped)" >&2 ;;
  esac
}
if [ "$nodes" -gt 1 ] || [ "$spares" -gt 0 ]; then
  what="local run"; [ "$dry" = true ] && what="dry run"
  echo "[train] $what: preset=$preset, $nodes simulated node(s) x $nproc processes$( ((spares)) && echo " + $spares hot spare(s)") (python -m training.launch, gloo on CPU)"
  launch=("$py" -m training.launch --nodes "$nodes" --spares "$spares" --nproc-per-node "$nproc")
  [ "$dry" = true ] && exec "${launch[@]}" --print -- "${preset_args[@]}" "$@"
  set +e
  "${launch[@]}" -- "${preset_args[@]}" "$@"
  rc=$?
  set -e
  resume_line "$rc" "$@"
  goodput_line "$rc" "$@"
  exit $rc
fi
if [ "$dry" = true ]; then
  echo "[train] dry run: $(dirname "$py")/torchrun --standalone --nproc_per_node=$nproc --max_restarts=$max_restarts -m training${preset_args[*]:+ ${preset_args[*]}} $*"
  exit 0
fi
echo "[train] local run: preset=$preset, $nproc processes (torchrun --standalone, gloo on CPU; a failed worker group restarts from the in-memory snapshot, at most $max_restarts times)"
set +e
# torchrun's agent through training.launch.agent: one line instead of tracebacks on Ctrl-C, workers die with it;
# --max_restarts: a worker that dies (or is killed for its silence or wedge) restarts the group on this node, which
# resumes from the snapshot in this node's memory (torchrun's standalone rendezvous: no coordinator needed for one node)
"$py" -m training.launch.agent --standalone --nproc_per_node="$nproc" --max_restarts="$max_restarts" -m training \
  "${preset_args[@]}" "$@"
rc=$?
set -e
case $rc in
  0) ;;
  130|138|143) resume_line "$rc" "$@" ;;
  2|3|4|5|6|7) ;;  # the job's own error line above names the problem and the fix; a plain rerun would not help
  *) echo "[train] failed with exit code $rc after at most $max_restarts automatic restart(s) (run 'make train' again to resume from the last complete checkpoint)" >&2 ;;
esac
goodput_line "$rc" "$@"
exit $rc

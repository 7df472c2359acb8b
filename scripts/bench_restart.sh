#!/usr/bin/env bash
# What a worker start costs, phase by phase (training/job/startup.py): each case is a short run whose worker is
# SIGKILLed after step KILL_AT and restarted by its agent, so its ledger holds a launch and a restart; prints each
# run's start-up table (python -m training.goodput) and writes bench/restart/<case>.json (the ledger as JSON).
#   cold               every worker a fresh interpreter (T5_WARM_WORKERS=0)
#   warm               workers forked from the agent's preloaded forkserver (the default)
#   compiled-cache     parallel.compile on, with the compile cache (training/model/compile_cache.py), from empty
#   compiled-nocache   parallel.compile on, no cache of any kind: Inductor's FX graph and AOTAutograd caches off
#   compiled-shared    a first start of a node that has never compiled (empty local caches) with the portable
#                      artefacts compiled-cache published: what a replacement node pays (no kill)
#   scripts/bench_restart.sh                          # all cases, debug preset, 1 process
#   CASES="warm compiled-cache" PRESET=t5-60m scripts/bench_restart.sh
# PYTHON selects the interpreter (a GPU machine's own, with a CUDA build of torch); extra args go to training.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$(scripts/venv.sh)}"
out="${OUT:-bench/restart}"
steps="${STEPS:-8}"
kill_at="${KILL_AT:-4}"
nproc="${NPROC:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1
mkdir -p "$out"
rm -rf "${out:?}"/runs "${out:?}"/tmp
case_run() {  # case_run NAME KILL(yes|no) ARGS...: one agent, the run in $out/runs/NAME, its own TMPDIR
  local name=$1 kill=$2; shift 2
  local dir="$out/runs/$name" fault=()
  [[ $kill == yes ]] && fault=(--fault.sigkill_at_step "$kill_at")
  mkdir -p "$out/tmp/$name"
  echo "[bench_restart] $name ..." >&2
  TMPDIR="$(realpath "$out/tmp/$name")" "$py" -m training.launch.agent --standalone --nproc_per_node="$nproc" \
    --max-restarts 1 -m training --preset "${PRESET:-debug}" --job.out_dir "$dir" --train.steps "$steps" \
    --checkpoint.interval 2 "${fault[@]}" "$@" "${EXTRA[@]}" >"$out/$name.log" 2>&1 \
    || { echo "[bench_restart] $name failed; see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; return 0; }
  "$py" -m training.goodput "$dir" --no-png | sed -n '/^start-up by phase/,/^(process:/p'
  "$py" -m training.goodput "$dir" --json >"$out/$name.json"
}
EXTRA=("$@")
read -ra cases <<<"${CASES:-cold warm compiled-cache compiled-nocache compiled-shared}"
for c in "${cases[@]}"; do
  case $c in
    cold) T5_WARM_WORKERS=0 case_run cold yes ;;
    warm) case_run warm yes ;;
    compiled-cache) case_run compiled-cache yes --parallel.compile on ;;
    compiled-nocache)
      TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 \
        case_run compiled-nocache yes --parallel.compile on --parallel.compile_cache_dir off ;;
    compiled-shared)
      case_run compiled-shared no --parallel.compile on \
        --parallel.compile_cache_dir "$out/runs/compiled-cache/compile-cache" ;;
    *) echo "bench_restart: unknown case '$c': use cold, warm, compiled-cache, compiled-nocache, compiled-shared" >&2
       exit 2 ;;
  esac
done

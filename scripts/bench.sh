#!/usr/bin/env bash
# make bench: tokens/s and checkpoint blocking time (async, sync, full-state-dict baseline) for the
# debug and t5-60m presets with NPROC (default 2) processes; prints a table, writes bench/out/*.json.
# PRESETS="debug t5-60m" selects presets; extra args go to the worker (e.g. --steps 8).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
nproc="${NPROC:-2}"
out=bench/out
mkdir -p "$out"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
files=()
for preset in ${PRESETS:-debug t5-60m}; do
  echo "[bench] $preset: $nproc processes ..." >&2
  "$(dirname "$py")/torchrun" --standalone --nproc_per_node="$nproc" -m training.bench run \
    --preset "$preset" --out "$out/$preset.json" "$@" >"$out/$preset.log" 2>&1 \
    || { echo "[bench] $preset failed; see $out/$preset.log" >&2; tail -20 "$out/$preset.log" >&2; exit 1; }
  files+=("$out/$preset.json")
done
"$py" -m training.bench report "${files[@]}" --json "$out/summary.json"

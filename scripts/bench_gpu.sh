#!/usr/bin/env bash
# The GPU efficiency table: step time, tokens/s, MFU and peak memory on ONE GPU for each attention kernel x
# regional compile, per preset, with one pass of BATCH samples per step (the presets' 256 is a 16-GPU batch; the
# README's t5-large figures use 32), then one full run of the first preset (checkpoint staging and snapshot
# figures). Prints the table; JSON and logs in bench/gpu/.
#   scripts/bench_gpu.sh                                  # t5-large and t5-3b, batch 32, 50 timed steps
#   PRESETS=t5-3b BATCH=16 STEPS=20 scripts/bench_gpu.sh
# Needs CUDA; uses the venv's torch unless PYTHON names another interpreter (e.g. one with the cluster image's
# torch, to compare versions).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$(scripts/venv.sh)}"
"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "bench_gpu: no CUDA device visible to $py (torch $("$py" -c 'import torch; print(torch.__version__)')):" \
          "run on a GPU machine with PYTHON=<an interpreter whose torch is a CUDA build>" >&2; exit 3; }
out=bench/gpu
mkdir -p "$out"
steps="${STEPS:-50}"
batch=(--train.global_batch "${BATCH:-32}" --train.micro_batch 0)
files=()
run() {  # run NAME ARGS...: one torchrun, log in $out/NAME.log
  local name=$1; shift
  echo "[bench_gpu] $name ..." >&2
  "$py" -m torch.distributed.run --standalone --nproc_per_node=1 -m training.bench run "$@" --out "$out/$name.json" \
    >"$out/$name.log" 2>&1 || { echo "[bench_gpu] $name failed; see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; return 0; }
  files+=("$out/$name.json")
}
read -ra presets <<<"${PRESETS:-t5-large t5-3b}"
for preset in "${presets[@]}"; do
  for attention in eager sdpa sdpa_bias; do
    for compile in off on; do
      run "$preset-$attention-compile-$compile" --preset "$preset" --steps "$steps" --steps-only \
        -- "${batch[@]}" --model.attention "$attention" --parallel.compile "$compile"
    done
  done
done
run "${presets[0]}-saves" --preset "${presets[0]}" --steps 10 --saves 2 -- "${batch[@]}"
"$py" -m training.bench report "${files[@]}" --json "$out/summary.json"

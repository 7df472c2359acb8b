#!/usr/bin/env bash
# The GPU figures on ONE GPU within one machine loan: rows in priority order, each started only while the time
# budget holds its estimate, each result written as it finishes, the rest named "skipped: budget".
#   1 preset    the preset as it ships (steps only: step time, tokens/s, MFU, peak memory)
#   2 compile   the same with parallel.compile on (its warm-up holds the compile)
#   3 saves     storage saves (async / sync / full-state-dict baseline), in-memory snapshots, restores
#   4 restart   a worker start by phase, warm and compiled with the compile cache (scripts/bench_restart.sh)
#   5 hf        a plain Hugging Face T5 of the same shape (fp32 weights, bf16 autocast, fused AdamW, no FSDP:
#               training/bench_hf.py); every other row's tokens/s is also shown as a multiple of it
#   The MFU levers of issue 51, each on its own row (steps only, like 1):
#   6 flex            --model.attention flex (FlexAttention, compiled; position bias as a score_mod), dropout 0
#   7 flex-compile    the same with every T5 block compiled too (parallel.compile on)
#   8 adamw-foreach   --train.adamw_impl foreach (the default is fused)
#   9 compile-report  graph breaks per T5 block and recompiles over 3 steps, flex + compiled blocks
#                     (python -m training.compile_report: compile-report.json)
#  10 batch-fit       the micro-batch chosen from measured memory (python -m training.batch_fit) and its steps
#                     beside the presets' 16 (scripts/bench_batch_fit.sh: batch-fit*.json)
#   scripts/bench_gpu.sh                              # t5-large, batch 32, 20 timed steps, BUDGET_S=480
#   PRESET=t5-3b BATCH=16 STEPS=8 BUDGET_S=600 scripts/bench_gpu.sh
#   ROWS="preset compile flex flex-compile adamw-foreach compile-report batch-fit hf" scripts/bench_gpu.sh  # MFU rows
# Writes bench/gpu/<row>.json (a row's figures), <row>.log, and summary.json (every row's status, rewritten after
# each row); prints the table at the end. EST_<ROW>=seconds overrides a row's estimate (defaults: H200, t5-large).
# Needs CUDA; PYTHON names another interpreter (e.g. one with the cluster image's torch). DRY_RUN=1 checks the
# plan on any machine: no CUDA check and no run, each row takes its estimate on a simulated clock.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$(scripts/venv.sh)}"
dry=$("$py" -m tools.env_flags DRY_RUN) || exit 2
if [[ $dry == false ]]; then
  "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { echo "bench_gpu: no CUDA device visible to $py (torch $("$py" -c 'import torch; print(torch.__version__)')):" \
            "run on a GPU machine with PYTHON=<an interpreter whose torch is a CUDA build>" >&2; exit 3; }
fi
out="${OUT:-bench/gpu}"
mkdir -p "$out"
budget="${BUDGET_S:-480}"
[[ $budget =~ ^[0-9]+$ ]] || { echo "bench_gpu: BUDGET_S=$budget is not whole seconds: e.g. BUDGET_S=480" >&2; exit 2; }
preset="${PRESET:-t5-large}"
steps="${STEPS:-20}"
batch=(--train.global_batch "${BATCH:-32}" --train.micro_batch 0)
all_rows=(preset compile saves restart hf flex flex-compile adamw-foreach compile-report batch-fit)
read -r -a rows <<<"${ROWS:-${all_rows[*]}}"
for r in "${rows[@]}"; do
  [[ " ${all_rows[*]} " == *" $r "* ]] \
    || { echo "bench_gpu: ROWS names '$r', not a row: use some of ${all_rows[*]}" >&2; exit 2; }
done
declare -A est=([preset]=60 [compile]=95 [saves]=240 [restart]=200 [hf]=40 [flex]=90 [flex-compile]=120
  [adamw-foreach]=60 [compile-report]=90 [batch-fit]=180)
for r in "${rows[@]}"; do
  var="EST_${r^^}"
  var="${var//-/_}"  # EST_FLEX_COMPILE for flex-compile
  est[$r]="${!var:-${est[$r]}}"
done
declare -A cmd
cmd[preset]="$py -m torch.distributed.run --standalone --nproc_per_node=1 -m training.bench run --preset $preset"
cmd[preset]+=" --steps $steps --steps-only --out $out/preset.json -- ${batch[*]}"
cmd[compile]="${cmd[preset]/preset.json/compile.json} --parallel.compile on"
cmd[saves]="$py -m torch.distributed.run --standalone --nproc_per_node=1 -m training.bench run --preset $preset"
cmd[saves]+=" --steps 10 --saves 2 --out $out/saves.json -- ${batch[*]}"
cmd[restart]="env PYTHON=$py OUT=$out/restart PRESET=$preset CASES='warm compiled-cache' STEPS=6 KILL_AT=3"
cmd[restart]+=" scripts/bench_restart.sh ${batch[*]}"
cmd[hf]="$py -m training.bench_hf --preset $preset --steps $((steps / 2 > 2 ? steps / 2 : 2)) --out $out/hf.json"
cmd[hf]+=" -- ${batch[*]}"
flex=(--model.attention flex --model.dropout 0)
cmd[flex]="${cmd[preset]/preset.json/flex.json} ${flex[*]}"
cmd[flex-compile]="${cmd[preset]/preset.json/flex-compile.json} ${flex[*]} --parallel.compile on"
cmd[adamw-foreach]="${cmd[preset]/preset.json/adamw-foreach.json} --train.adamw_impl foreach"
cmd[compile-report]="$py -m training.compile_report --preset $preset --steps 3 --out $out/compile-report.json"
cmd[compile-report]+=" -- ${flex[*]}"
cmd[batch-fit]="env PYTHON=$py OUT=$out PRESET=$preset BATCH=${BATCH:-32} STEPS=$steps scripts/bench_batch_fit.sh"

elapsed=0  # seconds of the budget used (simulated under DRY_RUN)
start=$SECONDS
declare -A status took
summary() {  # rewrite summary.json: every row so far, in priority order
  local r sep="" body=""
  for r in "${rows[@]}"; do
    [[ -n ${status[$r]:-} ]] || continue
    body+="$sep {\"row\": \"$r\", \"status\": \"${status[$r]}\", \"seconds\": ${took[$r]}, \"estimate_s\": ${est[$r]}}"
    sep=$',\n'
  done
  printf '{"budget_s": %s, "used_s": %s, "dry_run": %s, "rows": [\n%s\n]}\n' "$budget" "$elapsed" "$dry" "$body" \
    >"$out/summary.json"
}
n=0
for r in "${rows[@]}"; do
  n=$((n + 1))
  left=$((budget - elapsed))
  if ((est[$r] > left)); then
    status[$r]="skipped: budget"; took[$r]=0
    echo "[bench_gpu] $n $r: skipped: budget (needs ~${est[$r]} s, ${left} s left of $budget)" >&2
    summary
    continue
  fi
  echo "[bench_gpu] $n $r (~${est[$r]} s, ${left} s left): ${cmd[$r]}" >&2
  if [[ $dry == true ]]; then
    status[$r]="dry-run"; took[$r]=${est[$r]}
    elapsed=$((elapsed + est[$r]))
  else
    t0=$SECONDS
    if timeout --kill-after=10 "$left" bash -c "${cmd[$r]}" >"$out/$r.log" 2>&1; then
      status[$r]="ok"
    else
      rc=$?
      status[$r]="failed: exit $rc$( ((rc == 124)) && echo ' (out of budget)')"
      echo "[bench_gpu] $r failed; see $out/$r.log" >&2
      tail -5 "$out/$r.log" >&2
    fi
    took[$r]=$((SECONDS - t0))
    elapsed=$((SECONDS - start))
  fi
  summary
done
echo "[bench_gpu] summary: $out/summary.json (${elapsed} s of $budget)" >&2
files=()
for r in preset compile saves hf flex flex-compile adamw-foreach; do
  [[ -f $out/$r.json && ${status[$r]:-} == ok ]] && files+=("$out/$r.json")
done
for f in "$out"/batch-fit-chosen.json "$out"/batch-fit-16.json; do  # the chosen micro-batch's steps beside 16's
  [[ -f $f && ${status[batch-fit]:-} == ok ]] && files+=("$f")
done
if ((${#files[@]})); then
  "$py" -m training.bench report "${files[@]}" --json "$out/report.json"
fi
if [[ ${status[restart]:-} == ok ]]; then
  cat "$out/restart.log"
fi
if [[ ${status[compile-report]:-} == ok ]]; then
  cat "$out/compile-report.json"
fi
if [[ ${status[batch-fit]:-} == ok ]]; then
  grep -h -e "peak GB at micro-batch" -e "train.micro_batch = " "$out/batch-fit.log"
fi

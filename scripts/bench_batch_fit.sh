#!/usr/bin/env bash
# bench_gpu.sh's batch-fit row (issue 51, lever 5): the micro-batch chosen from measured memory, and its steps beside
# the presets' 16, on one GPU at the bench's global batch.
#   1 python -m training.batch_fit for the bench's plan (1 node x 1 GPU, global batch BATCH): a step's peak GPU
#     memory at micro-batches 2 4 8, the line through them, the choice -> $OUT/batch-fit.json
#   2 the same figures for the presets' job (2 nodes x 8 GPUs kept down to 1 node, the preset's global batch): no
#     measuring, the choice only -> $OUT/batch-fit-plan.json
#   3 steps at the chosen micro-batch and at 16 (training.bench --steps-only; one run when they are the same) ->
#     $OUT/batch-fit-chosen.json, $OUT/batch-fit-16.json: step time, MFU, peak GB beside batch-fit.json's prediction
# Env (bench_gpu.sh sets them): PYTHON, OUT (bench/gpu), PRESET (t5-large), BATCH (32), STEPS (20). Needs CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$(scripts/venv.sh)}"
out="${OUT:-bench/gpu}"
preset="${PRESET:-t5-large}"
batch="${BATCH:-32}"
steps="${STEPS:-20}"
mkdir -p "$out"
"$py" -m training.batch_fit --preset "$preset" --nodes 1 --nproc-per-node 1 --out "$out/batch-fit.json" \
  -- --train.global_batch "$batch"
"$py" -m training.batch_fit --preset "$preset" --nodes 2 --min-nodes 1 --nproc-per-node 8 \
  --measured "$out/batch-fit.json" --out "$out/batch-fit-plan.json"
micro=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["micro_batch"])' "$out/batch-fit.json")
steps_at() {  # steps_at NAME MICRO_BATCH: the bench's timed steps at that micro-batch
  "$py" -m torch.distributed.run --standalone --nproc_per_node=1 -m training.bench run --preset "$preset" \
    --steps "$steps" --steps-only --out "$out/batch-fit-$1.json" \
    -- --train.global_batch "$batch" --train.micro_batch "$2"
}
steps_at chosen "$micro"
if [[ $micro != 16 ]]; then
  steps_at 16 16
fi

#!/usr/bin/env bash
# make chaos-test PLATFORM=eks: on a live EKS cluster (current kubeconfig), submit a TrainJob, delete a pod
# that is not node 0, then node 0's pod (optionally --drain-node), watch the JobSet restarts, read the job's
# metrics from FSx through a reader pod, and check step continuity, steps lost and completion
# (docs/kubernetes.md). Exits non-zero with the reason when there is no usable cluster.
# Arguments go to python -m chaos.eks (--help). Costs GPU time.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
exec "$py" -m chaos.eks "$@"

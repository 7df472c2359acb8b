#!/usr/bin/env bash
# make train PLATFORM=eks: submit the T5 job to EKS as a Kubeflow Trainer TrainJob on our fault-tolerant
# ClusterTrainingRuntime, follow node 0's log and wait for the end (docs/kubernetes.md).
#   DRY_RUN=1  print the TrainJob YAML instead (offline; no cluster or credentials needed)
# Reads PRESET, NODES, NPROC, DRY_RUN, IMAGE, IMAGE_TAG from the environment. Arguments go to
# python -m tools.k8s.submit (--help): its own options, and training overrides (--section.field).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
exec "$py" -m tools.k8s.submit "$@"

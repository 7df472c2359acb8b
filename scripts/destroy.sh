#!/usr/bin/env bash
# make destroy PLATFORM=eks|parallelcluster [ARGS="--cluster-only"]
# Delete the deployment's stacks with the pinned CDK CLI (it asks before deleting; ARGS="--force" does not).
# --cluster-only deletes only <prefix>-eks / <prefix>-pcluster (storage and network stay: cheap, and a later
# deploy reuses them). The saved settings (cdk.context.json) stay, so `make deploy` brings the same deployment back.
# What a full destroy keeps, on purpose: the data bucket (checkpoints) and its access-log bucket; the ECR
# repository is deleted with its images (rebuild with make image), the EKS control-plane log group too.
# Export the newest checkpoints to S3 first (docs/deploy.md, "Teardown"). DRY_RUN=1 prints the command only.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
source scripts/cdk_lib.sh
cdk_platform destroy
dry=$(python3 -m tools.env_flags DRY_RUN) || exit 2
scripts/venv.sh >/dev/null
cluster_only=false
args=()
for a in "$@"; do
  if [ "$a" = "--cluster-only" ]; then cluster_only=true; else args+=("$a"); fi
done
stacks=$(.venv/bin/python -m stacks.deploy_config show "$platform") || exit 2
read -r network storage cluster <<<"$stacks"
case "$platform" in eks) cluster_id=Eks ;; *) cluster_id=ParallelCluster ;; esac
if [ "$cluster_only" = true ]; then
  cmd=(node_modules/.bin/cdk destroy -c "platform=$platform" "$cluster_id" ${args[@]+"${args[@]}"})
  echo "[destroy] deletes $cluster; keeps $storage and $network" >&2
else
  cmd=(node_modules/.bin/cdk destroy --all -c "platform=$platform" ${args[@]+"${args[@]}"})
  echo "[destroy] deletes $cluster, $storage, $network; keeps the data bucket and its access-log bucket" \
       "(the only copy of the checkpoints; docs/deploy.md \"Teardown\" says what they cost and how to delete them)" >&2
fi
if [ "$dry" = true ]; then
  printf '[destroy] would run:'; printf ' %q' "${cmd[@]}"; echo
  exit 0
fi
# AWS first: offline, a missing region or refused credentials would otherwise surface after npm ci and a synth,
# as CDK's "Unable to resolve AWS account" (stacks/aws_access.py; one line, exit 1)
.venv/bin/python -m stacks.aws_access "make destroy" "$@" || exit 1
cdk_cli_ready
"${cmd[@]}"

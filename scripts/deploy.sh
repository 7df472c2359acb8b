#!/usr/bin/env bash
# make deploy PLATFORM=eks|parallelcluster [ARGS="-c key=value ..."]
# Deploy the network, storage and platform stacks with the pinned CDK CLI (needs AWS credentials and a
# bootstrapped account: npx cdk bootstrap aws://ACCOUNT/REGION). The -c values are checked like make synth's,
# then SAVED in cdk.context.json, which every later deploy (and make synth, npx cdk ...) reads: a redeploy that
# passes one new value (-c imageTag=src-...) keeps adminRoleArn, gpuNodes, apiAllowedCidrs, the AZ and the rest.
# PLATFORM=eks needs apiAllowedCidrs and adminRoleArn saved or given once (the error says what to pass).
# Run `make preflight PLATFORM=...` first: it checks quota, AZ offer and reservation, and saves the AZ.
# DRY_RUN=1 prints what would be saved and the cdk command, and changes nothing. Other ARGS go to `cdk deploy`
# (it asks before IAM or security-group changes; ARGS="--require-approval never" for an unattended deploy).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
platform="${PLATFORM:-eks}"
case "$platform" in
  eks|parallelcluster) ;;
  slurm) platform=parallelcluster ;;
  *) echo "error: PLATFORM=$platform: deploy supports PLATFORM=eks or PLATFORM=parallelcluster" >&2; exit 2 ;;
esac
dry=$(python3 -m tools.env_flags DRY_RUN) || exit 2
scripts/venv.sh >/dev/null
if [ "$dry" = true ]; then
  .venv/bin/python -m stacks.deploy_config deploy "$platform" --dry-run "$@"
else
  .venv/bin/python -m stacks.deploy_config deploy "$platform" "$@"
fi
cmd=(node_modules/.bin/cdk deploy --all -c "platform=$platform" "$@")
if [ "$dry" = true ]; then
  printf '[deploy] would run:'; printf ' %q' "${cmd[@]}"; echo
  exit 0
fi
[ -x node_modules/.bin/cdk ] || npm ci --no-audit --no-fund --loglevel=error >&2
export CDK_DISABLE_CLI_TELEMETRY=true
"${cmd[@]}"

#!/usr/bin/env bash
# make deploy PLATFORM=eks|parallelcluster [ARGS="-c key=value ..."]
# Deploy the network, storage and platform stacks with the pinned CDK CLI (needs AWS credentials and a
# bootstrapped account: npx cdk bootstrap aws://ACCOUNT/REGION). The -c values are checked like make synth's,
# then SAVED in cdk.context.json, which every later deploy (and make synth, npx cdk ...) reads: a redeploy that
# passes one new value (-c imageTag=src-...) keeps adminRoleArn, gpuNodes, apiAllowedCidrs, the AZ and the rest.
# PLATFORM=eks needs apiAllowedCidrs and adminRoleArn saved or given once (the error says what to pass).
# PLATFORM=eks: imageTag (the runtime's default image) is this checkout's tag, the one `make image` pushes from here, unless one
# is saved or given: it is then saved like the rest (-c imageTag=<tag> changes it, -c imageTag= resets it).
# Run `make preflight PLATFORM=...` first: it checks quota, AZ offer and reservation, and saves the AZ.
# DRY_RUN=1 prints what would be saved and the cdk command, and changes nothing. Other ARGS go to `cdk deploy`
# (it asks before IAM or security-group changes; ARGS="--require-approval never" for an unattended deploy).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
source scripts/cdk_lib.sh
cdk_platform deploy
dry=$(python3 -m tools.env_flags DRY_RUN) || exit 2
scripts/venv.sh >/dev/null

image_tag_chosen() {  # true when the arguments give a non-empty imageTag, or cdk.context.json has one they keep
  .venv/bin/python - "$@" <<'PY'
import sys
from pathlib import Path

from stacks.config import ConfigError
from stacks.deploy_config import load_saved
from stacks.synth_check import context_args

try:
    given = context_args(sys.argv[1:]).get("imageTag")
    saved = load_saved(Path.cwd())
except ConfigError:
    sys.exit(0)  # bad arguments or a broken saved file: the deploy check below names them
sys.exit(0 if (given.strip() if given is not None else "imageTag" in saved) else 1)
PY
}
# TrainJobs that name no image run the runtime's default image: make it the one `make image` pushes from here,
# so deploy -> make image -> make train works the first time.
if [ "$platform" = eks ] && ! image_tag_chosen "$@"; then
  tag=$(python3 -m tools.image_tag) || exit 2
  echo "[deploy] imageTag=$tag: this checkout's image tag, the one \`make image\` pushes (run it before make train)" >&2
  set -- "$@" -c "imageTag=$tag"
fi
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
# AWS first: offline, a missing region or refused credentials would otherwise surface after npm ci and a synth,
# as CDK's "Unable to resolve AWS account" (stacks/aws_access.py; one line, exit 1)
.venv/bin/python -m stacks.aws_access "make deploy" "$@" || exit 1
cdk_cli_ready
"${cmd[@]}"

#!/usr/bin/env bash
# Sourced by synth.sh, deploy.sh and destroy.sh: what every command that runs the pinned CDK CLI does first.
#   cdk_platform VERB   PLATFORM (eks by default; slurm means parallelcluster) -> $platform, or exit 2 naming it
#   cdk_cli_ready       the pinned CDK CLI in node_modules (npm ci when it is missing or another version),
#                       telemetry off, and one short note instead of jsii's banner on a Node it does not support

cdk_platform() {
  platform="${PLATFORM:-eks}"
  case "$platform" in
    eks|parallelcluster) ;;
    slurm) platform=parallelcluster ;;
    *) echo "error: PLATFORM=$platform: $1 supports PLATFORM=eks or PLATFORM=parallelcluster" >&2; exit 2 ;;
  esac
}

installed_cdk() { node -p "try { require('./node_modules/aws-cdk/package.json').version } catch (e) { '' }"; }  # the CDK CLI version in node_modules, or empty

cdk_cli_ready() {
  command -v node >/dev/null || { echo "error: node (>= 18) is required for the CDK CLI; install Node.js 22 or 24" >&2; exit 2; }
  local want have node_major
  want=$(node -p "require('./package.json').devDependencies['aws-cdk']")
  have=$(installed_cdk)
  if [ "$have" != "$want" ]; then
    exec 9<package-lock.json
    command -v flock >/dev/null && flock 9  # one npm ci at a time (two synths at once, the test suite's workers); a second caller finds it done
    have=$(installed_cdk)
    if [ "$have" != "$want" ]; then
      echo "[cdk] installing the pinned CDK CLI aws-cdk@$want (npm ci)" >&2
      npm ci --no-audit --no-fund --loglevel=error >&2
    fi
    exec 9<&-
  fi
  export CDK_DISABLE_CLI_TELEMETRY=true
  # The CDK CLI accepts Node >= 18, but jsii (which runs the Python CDK app) supports only Node 22 and 24 and
  # prints a 12-line banner on older ones; say it once, briefly, instead.
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$node_major" -lt 22 ]; then
    echo "[cdk] note: Node $node_major is end-of-life and unsupported by jsii (the Python CDK runtime); it still works, but install Node 22 or 24" >&2
    export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="$node_major" JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1
  fi
}

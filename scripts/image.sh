#!/usr/bin/env bash
# make image [ARGS="--tag TAG --stack STACK --region REGION --dry-run"]
# Build the training image (cluster_assets/docker/Dockerfile: AWS PyTorch DLC + training/ + cluster_facts/) and push it to
# the ECR repository of the deployed storage stack. Needs Docker, the AWS CLI and AWS credentials.
#   --tag TAG        image tag (default: IMAGE_TAG, else the git commit, +"-dirty" with local changes);
#                    ECR tags are immutable, so an existing tag is reported and not rebuilt
#   --stack NAME     stack whose EcrRepositoryUri output names the repository (default: STACK, else t5ft-storage)
#   --repo URI       skip the stack lookup and push to this repository URI (ECR_REPO)
#   --region REGION  AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the CLI's configured region)
#   --dry-run        print the commands instead of running them (works offline, without credentials)
set -euo pipefail
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."

tag="${IMAGE_TAG:-}" stack="${STACK:-t5ft-storage}" repo="${ECR_REPO:-}" dry=0
region="${AWS_REGION:-${AWS_DEFAULT_REGION:-}}"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --stack) stack="$2"; shift 2 ;;
    --repo) repo="$2"; shift 2 ;;
    --region) region="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "error: $*" >&2; exit 2; }
run() { if [ "$dry" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi; }

if [ -z "$tag" ]; then
  tag=$(git rev-parse --short=12 HEAD 2>/dev/null || echo "")
  [ -n "$tag" ] || die "no git commit to tag the image with; pass --tag TAG (or IMAGE_TAG=...)"
  if [ -n "$(git status --porcelain -- training cluster_facts requirements.txt cluster_assets/docker 2>/dev/null)" ]; then
    tag="$tag-dirty"
  fi
fi
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag '$tag' is not a valid image tag"

if [ "$dry" = 0 ]; then
  command -v docker >/dev/null || die "docker is not installed; install Docker (or use --dry-run to see the steps)"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable (start it, or check permissions on its socket)"
  command -v aws >/dev/null || die "the AWS CLI v2 is not installed; see https://docs.aws.amazon.com/cli/"
  aws sts get-caller-identity >/dev/null 2>&1 \
    || die "no valid AWS credentials (aws sts get-caller-identity failed); configure a profile or SSO login"
  [ -n "$region" ] || region=$(aws configure get region || true)
  [ -n "$region" ] || die "no AWS region: pass --region or set AWS_REGION"
fi
region_args=()
[ -n "$region" ] && region_args=(--region "$region")

if [ -z "$repo" ]; then
  if [ "$dry" = 1 ]; then
    repo="<EcrRepositoryUri of $stack>"
  else
    repo=$(aws cloudformation describe-stacks "${region_args[@]}" --stack-name "$stack" \
      --query "Stacks[0].Outputs[?OutputKey=='EcrRepositoryUri'].OutputValue" --output text 2>/dev/null || true)
    [ -n "$repo" ] && [ "$repo" != "None" ] \
      || die "stack '$stack' has no EcrRepositoryUri output in ${region:-the default region}; deploy it first (docs/deploy.md) or pass --stack/--repo"
  fi
fi
registry="${repo%%/*}"
name="${repo#*/}"
image="$repo:$tag"

if [ "$dry" = 0 ] && aws ecr describe-images "${region_args[@]}" --repository-name "$name" \
     --image-ids imageTag="$tag" >/dev/null 2>&1; then
  echo "[image] $image already exists (tags are immutable); nothing to do"
  echo "$image"
  exit 0
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# Minimal build context: never send .venv, cdk.out or runs/ to the daemon.
cp cluster_assets/docker/Dockerfile requirements.txt "$ctx"/
cp -r training "$ctx"/training
cp -r cluster_facts "$ctx"/cluster_facts
find "$ctx/training" "$ctx/cluster_facts" -name __pycache__ -prune -exec rm -rf {} +

echo "[image] building $image" >&2
if [ "$dry" = 1 ]; then
  printf '+ %s\n' "aws ecr get-login-password ${region_args[*]} | docker login --username AWS --password-stdin $registry"
else
  aws ecr get-login-password "${region_args[@]}" | docker login --username AWS --password-stdin "$registry"
fi
run docker build --platform linux/amd64 -t "$image" "$ctx"
run docker push "$image"
[ "$dry" = 1 ] && echo "[image] dry run: nothing was built or pushed" >&2 && exit 0
echo "[image] pushed; use it with -c imageTag=$tag (runtime default) or a TrainJob's spec.trainer.image" >&2
echo "$image"

#!/usr/bin/env bash
# make image [ARGS="--tag TAG --stack STACK --region REGION --dry-run"]
# Build the training image (cluster_assets/docker/Dockerfile: AWS PyTorch DLC + training/ + cluster_facts/) and push it to
# the ECR repository of the deployed storage stack (<namePrefix>/t5-train). Needs Docker, the AWS CLI and AWS credentials.
#   --tag TAG        image tag (default: IMAGE_TAG, else this checkout's content tag src-<12 hex> from
#                    tools/image_tag.py, the tag `make train PLATFORM=eks` submits); ECR tags are immutable, so an
#                    existing tag is reported and not rebuilt (same tag = same code)
#   --stack NAME     stack whose EcrRepositoryUri output names the repository (default: STACK, else the saved
#                    deployment's <namePrefix>-storage: cdk.context.json over cdk.json, as make deploy saved them)
#   --repo URI       skip the stack lookup and push to this repository URI (ECR_REPO)
#   --region REGION  AWS region (default: the saved deployment's region, else AWS_REGION / AWS_DEFAULT_REGION /
#                    the CLI's configured region)
#   --dry-run        print the commands instead of running them (works offline, without credentials);
#                    DRY_RUN=1/true/yes/on does the same
# Prints the pushed image (<repository URI>:<tag>) last.
set -euo pipefail
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."
die() { echo "error: $*" >&2; exit 2; }
command -v python3 >/dev/null || die "python3 is required (the project's Python 3.11+)"

tag="${IMAGE_TAG:-}" tag_from=IMAGE_TAG stack="${STACK:-}" repo="${ECR_REPO:-}" region="" dry=0
# DRY_RUN as every script reads it (tools/env_flags.py); the Makefile exports it.
dry_env=$(python3 -m tools.env_flags DRY_RUN) || exit 2
[ "$dry_env" = true ] && dry=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; tag_from=--tag; shift 2 ;;
    --stack) stack="$2"; shift 2 ;;
    --repo) repo="$2"; shift 2 ;;
    --region) region="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

run() { if [ "$dry" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi; }

# Minimal build context (never .venv, cdk.out or runs/), and its content tag, from one list: tools/image_tag.py.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
src_tag=$(python3 -m tools.image_tag --context "$ctx") || exit 2
[ -n "$tag" ] || tag="$src_tag"
# the rule of tools/image_tag.py VALID_TAG (what Docker and ECR accept)
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "$tag_from='$tag' is not a valid image tag: use up to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-' (e.g. v1.2), or unset it for this checkout's src-<digest> tag"

if [ "$dry" = 0 ]; then
  command -v docker >/dev/null || die "docker is not installed; install Docker (or use --dry-run to see the steps)"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable (start it, or check permissions on its socket)"
  command -v aws >/dev/null || die "the AWS CLI v2 is not installed; see https://docs.aws.amazon.com/cli/"
  aws sts get-caller-identity >/dev/null 2>&1 \
    || die "no valid AWS credentials (aws sts get-caller-identity failed); configure a profile or SSO login"
fi
# The deployment make deploy saved (name prefix, region), as deploy.sh and destroy.sh read it: a deployment with
# another namePrefix or region pushes to its own repository, not t5ft's in the shell's default region.
if [ -z "$stack" ] || [ -z "$region" ]; then
  scripts/venv.sh >/dev/null
  saved=$(.venv/bin/python -m stacks.deploy_config storage) || exit 2
  read -r saved_stack saved_region <<<"$saved"
  [ -n "$stack" ] || stack="$saved_stack"
  region="${region:-${saved_region:-${AWS_REGION:-${AWS_DEFAULT_REGION:-}}}}"
fi
if [ "$dry" = 0 ]; then
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
  echo "[image] $image already exists (tags are immutable); nothing to do" >&2
  echo "$image"
  exit 0
fi

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "[image] building $image (commit $revision)" >&2
if [ "$dry" = 1 ]; then
  printf '+ %s\n' "aws ecr get-login-password ${region_args[*]} | docker login --username AWS --password-stdin $registry"
else
  aws ecr get-login-password "${region_args[@]}" | docker login --username AWS --password-stdin "$registry"
fi
run docker build --platform linux/amd64 --label "org.opencontainers.image.revision=$revision" -t "$image" "$ctx"
run docker push "$image"
[ "$dry" = 1 ] && echo "[image] dry run: nothing was built or pushed" >&2 && exit 0
if [ "$tag" = "$src_tag" ]; then
  echo "[image] pushed; \`make train PLATFORM=eks\` from this checkout submits it (tag $tag)" >&2
else
  echo "[image] pushed; submit it with \`make train PLATFORM=eks IMAGE_TAG=$tag\`" >&2
fi
# The EKS runtime's store pods run <repo>:imageTag (saved in cdk.context.json by make deploy): say when it is another.
runtime_tag=$(python3 -c 'import json, sys
try: print(json.load(open(sys.argv[1])).get("imageTag", ""))
except (OSError, ValueError, AttributeError): print("")' cdk.context.json)
if [ "$runtime_tag" = "$tag" ]; then
  echo "[image] it is also the EKS runtime's default image (imageTag in cdk.context.json)" >&2
else
  runtime_image="$repo:$runtime_tag"
  [ -n "$runtime_tag" ] || runtime_image="not set by make deploy here"
  echo "[image] the EKS runtime's default image is $runtime_image;" \
       "to make it this one: make deploy PLATFORM=eks ARGS=\"-c imageTag=$tag\" (saved; the other settings are kept)" >&2
fi
echo "$image"

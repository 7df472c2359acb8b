#!/bin/bash
# Enable Pyxis (Slurm's container plugin) and Enroot on a ParallelCluster node and let Enroot pull from the
# deployment's ECR registry. Run by ParallelCluster as a custom action, as root:
#   head node:     HeadNode.CustomActions.OnNodeConfigured   pyxis_enroot.sh head    ECR_REGISTRY REGION
#   compute nodes: SlurmQueues[].CustomActions.OnNodeStart   pyxis_enroot.sh compute ECR_REGISTRY REGION
# ECR_REGISTRY is <account>.dkr.ecr.<region>.amazonaws.com (the host part of the stack's EcrRepositoryUri).
#
# ParallelCluster 3.11.1+ AMIs ship Pyxis and Enroot installed but disabled. The enabling steps follow the AWS
# ParallelCluster User Guide, "Running containerized jobs with Pyxis"
# (https://docs.aws.amazon.com/parallelcluster/latest/ug/tutorials_11_running-containerized-jobs-with-pyxis.html):
# Enroot's persistent (/var/enroot) and volatile (/run/enroot) directories, the sample enroot.conf from
# /opt/parallelcluster/examples, Pyxis' runtime directory (/run/pyxis) and, on the head node, the SPANK plugstack
# with pyxis.conf in /opt/slurm/etc (which the compute nodes mount from the head node) and `scontrol reconfigure`.
# Where this script differs from the guide, and why:
#   * files are copied, not moved: the script can run again (a re-run leaves the same result);
#   * /run is a tmpfs, so a systemd-tmpfiles entry recreates /run/enroot and /run/pyxis after a reboot;
#   * ECR credentials (the guide's cluster pulls public images only): Enroot reads the netrc-style file
#     $ENROOT_CONFIG_PATH/.credentials and, when a password starts with '$', evaluates it at each import
#     (Enroot's doc/cmd/import.md, "Amazon Elastic Container Registry" example). The file therefore holds the
#     command `aws ecr get-login-password`, not a token: every pull gets a fresh 12-hour token with the node's
#     instance role, nothing expires on disk and the file holds no secret. It lives in one system-wide
#     ENROOT_CONFIG_PATH so that every cluster user gets it; a user who exports ENROOT_CONFIG_PATH replaces it.
#
# T5_SETUP_ROOT=DIR (tests, inspection): write every file under DIR instead of / and log the system commands to
# DIR/commands.log instead of running them.
set -euo pipefail

usage() { echo "usage: $0 head|compute ECR_REGISTRY REGION" >&2; exit 2; }
[ $# -eq 3 ] || usage
ROLE=$1 REGISTRY=$2 REGION=$3
case "$ROLE" in head|compute) ;; *) echo "$0: role '$ROLE' must be head or compute" >&2; usage ;; esac
if ! [[ "$REGISTRY" =~ ^[0-9]{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$ ]]; then
  echo "$0: ECR_REGISTRY '$REGISTRY' is not <account>.dkr.ecr.<region>.amazonaws.com" >&2; exit 2
fi
if ! [[ "$REGION" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]$ ]]; then
  echo "$0: REGION '$REGION' is not a region name such as us-east-1" >&2; exit 2
fi

ROOT=${T5_SETUP_ROOT:-}
run() {  # a command that changes the running system: logged instead under T5_SETUP_ROOT
  if [ -n "$ROOT" ]; then echo "$*" >> "$ROOT/commands.log"; else "$@"; fi
}

EXAMPLES=$ROOT/opt/parallelcluster/examples
ENROOT_CONF=$ROOT/etc/enroot/enroot.conf
# System-wide ENROOT_CONFIG_PATH (see the header): only .credentials in it, readable by all, no secret inside.
ENROOT_SHARED_CONFIG=/etc/enroot/cluster-config

for f in "$EXAMPLES/enroot/enroot.conf" "$EXAMPLES/pyxis/pyxis.conf" "$EXAMPLES/spank/plugstack.conf"; do
  if [ ! -f "$f" ]; then
    echo "$0: $f is missing: Pyxis/Enroot need a ParallelCluster 3.11.1+ AMI, whose examples enable them" >&2
    exit 1
  fi
done
AWS_CLI=$(command -v aws) || { echo "$0: the AWS CLI (aws) is not on PATH; Enroot needs it for ECR tokens" >&2; exit 1; }

echo "[pyxis_enroot] enabling Enroot and Pyxis on the $ROLE node; ECR registry $REGISTRY ($REGION)"

# Enroot: persistent cache (layers) on local disk, runtime and container data under /run; sticky and
# world-writable like /tmp, because every user's jobs create their own subdirectories.
install -d -m 1777 "$ROOT/var/enroot"
install -d -m 0755 "$ROOT/etc/tmpfiles.d"
cat > "$ROOT/etc/tmpfiles.d/t5-pyxis-enroot.conf" <<CONF
# Enroot and Pyxis runtime directories (tmpfs): recreated at every boot (cluster_assets/parallelcluster/node_setup)
d /run/enroot 1777 root root -
d /run/pyxis 1777 root root -
CONF
if [ -n "$ROOT" ]; then
  install -d -m 1777 "$ROOT/run/enroot" "$ROOT/run/pyxis"
else
  systemd-tmpfiles --create /etc/tmpfiles.d/t5-pyxis-enroot.conf
fi

install -d -m 0755 "$(dirname "$ENROOT_CONF")"
install -m 0644 "$EXAMPLES/enroot/enroot.conf" "$ENROOT_CONF"
# Enroot keeps the first value it reads for a key (main file before enroot.conf.d drop-ins), so the example's
# own ENROOT_CONFIG_PATH line is replaced rather than overridden.
sed -i '/^[[:space:]]*ENROOT_CONFIG_PATH[[:space:]]/d' "$ENROOT_CONF"
printf '\n# ECR credentials for every user (cluster_assets/parallelcluster/node_setup/pyxis_enroot.sh)\n' >> "$ENROOT_CONF"
printf 'ENROOT_CONFIG_PATH %s\n' "$ENROOT_SHARED_CONFIG" >> "$ENROOT_CONF"

install -d -m 0755 "$ROOT$ENROOT_SHARED_CONFIG"
umask 022
cat > "$ROOT$ENROOT_SHARED_CONFIG/.credentials.tmp" <<CREDS
# Enroot evaluates a password that starts with '\$' at each import: a fresh ECR token from the instance role.
machine $REGISTRY login AWS password \$($AWS_CLI ecr get-login-password --region $REGION)
CREDS
chmod 0644 "$ROOT$ENROOT_SHARED_CONFIG/.credentials.tmp"
mv -f "$ROOT$ENROOT_SHARED_CONFIG/.credentials.tmp" "$ROOT$ENROOT_SHARED_CONFIG/.credentials"

if [ "$ROLE" = head ]; then
  # The plugstack lives in /opt/slurm/etc, which the compute nodes mount from the head node: enabling Pyxis
  # here enables it cluster-wide; slurmctld and the running slurmds re-read it on reconfigure.
  install -d -m 0755 "$ROOT/opt/slurm/etc/plugstack.conf.d"
  install -m 0644 "$EXAMPLES/spank/plugstack.conf" "$ROOT/opt/slurm/etc/plugstack.conf"
  install -m 0644 "$EXAMPLES/pyxis/pyxis.conf" "$ROOT/opt/slurm/etc/plugstack.conf.d/pyxis.conf"
  run /opt/slurm/bin/scontrol reconfigure
else
  # Ubuntu 24.04's AppArmor blocks the unprivileged user namespaces Enroot needs (same guide).
  # shellcheck disable=SC1091  # the node's own os-release
  . "$ROOT/etc/os-release"
  if [ "${ID:-}${VERSION_ID:-}" = ubuntu24.04 ]; then
    install -d -m 0755 "$ROOT/etc/sysctl.d"
    echo "kernel.apparmor_restrict_unprivileged_userns = 0" \
      > "$ROOT/etc/sysctl.d/99-pcluster-disable-apparmor-restrict-unprivileged-userns.conf"
    run sysctl --system
  fi
fi
echo "[pyxis_enroot] done: srun --container-image=$REGISTRY/<repository>:<tag> pulls with the node's role"

#!/bin/bash
# What every ParallelCluster node needs before the project runs there, as root (a custom action):
#   head node:     HeadNode.CustomActions.OnNodeConfigured  node_base.sh head    CLUSTER_USER SHARED_DIR
#   compute nodes: SlurmQueues[].CustomActions.OnNodeStart  node_base.sh compute CLUSTER_USER SHARED_DIR
#     CLUSTER_USER  the OS's default user (ec2-user on Amazon Linux/RHEL, ubuntu on Ubuntu, rocky on Rocky):
#                   the same uid on every node, so its files on the shared file system are its own everywhere
#     SHARED_DIR    the FSx for Lustre mount (/fsx)
#
# * Python >= 3.11 (pyproject.toml) on every node: the venv scripts/venv.sh makes on /fsx links to the system
#   interpreter, which venv-mode jobs then run on the compute nodes too. Amazon Linux 2023 ships 3.9 as python3,
#   so python3.11 comes from dnf (Ubuntu 22.04: apt's python3.11 + python3.11-venv; Ubuntu 24.04 has 3.12).
#   Nothing is installed when a new enough one is on PATH. The head node also gets git (the checkout).
# * Head node only, on the shared file system (idempotent; existing directories keep their contents and owner):
#     SHARED_DIR/checkpoints, SHARED_DIR/runs  mode 1777 (sticky, like /tmp): every user's Slurm jobs create their
#                                             run's directories there (docs/slurm.md); nobody removes another's
#     SHARED_DIR/users/CLUSTER_USER           owned by CLUSTER_USER: that user's own space
#     SHARED_DIR/t5-failover                  owned by CLUSTER_USER, empty: where docs/slurm.md clones the
#                                             repository and the rendezvous store looks first
#
# T5_SETUP_ROOT=DIR (tests, inspection): read os-release and write the directories under DIR instead of /, and log
# the package-manager commands to DIR/commands.log instead of running them.
set -euo pipefail

usage() { echo "usage: $0 head|compute CLUSTER_USER SHARED_DIR" >&2; exit 2; }
[ $# -eq 3 ] || usage
ROLE=$1 CLUSTER_USER=$2 SHARED=$3
case "$ROLE" in head|compute) ;; *) echo "$0: role '$ROLE' must be head or compute" >&2; usage ;; esac
if ! [[ "$SHARED" =~ ^/[A-Za-z0-9_./-]+$ ]]; then
  echo "$0: SHARED_DIR '$SHARED' must be an absolute path such as /fsx" >&2; exit 2
fi
if ! id "$CLUSTER_USER" >/dev/null 2>&1; then
  echo "$0: CLUSTER_USER '$CLUSTER_USER' does not exist on this node: pass the OS's default user (ec2-user," \
       "ubuntu or rocky)" >&2
  exit 2
fi

ROOT=${T5_SETUP_ROOT:-}
run() {  # a command that changes the running system: logged instead under T5_SETUP_ROOT
  if [ -n "$ROOT" ]; then echo "$*" >> "$ROOT/commands.log"; else "$@"; fi
}

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
has_python311() {  # the interpreters scripts/venv.sh would pick, in its order
  local c
  for c in python3.13 python3.12 python3.11 python3; do
    command -v "$c" >/dev/null && new_enough "$c" && { echo "$c"; return 0; }
  done
  return 1
}

install_packages() {  # Python 3.11 where none is new enough; git on the head node where it is missing
  local found want_python=1 want_git=0
  if found=$(has_python311); then
    echo "[node_base] $found is Python 3.11 or newer"
    want_python=0
  fi
  [ "$ROLE" = head ] && ! command -v git >/dev/null && want_git=1
  [ $want_python = 1 ] || [ $want_git = 1 ] || return 0
  # shellcheck disable=SC1091  # the node's own os-release
  . "$ROOT/etc/os-release"
  local pkgs=()
  case "${ID:-}" in
    amzn|rhel|rocky|centos|fedora)
      [ $want_python = 1 ] && pkgs+=(python3.11)
      [ $want_git = 1 ] && pkgs+=(git)
      run dnf install -y "${pkgs[@]}" ;;
    ubuntu|debian)
      [ $want_python = 1 ] && pkgs+=(python3.11 python3.11-venv)
      [ $want_git = 1 ] && pkgs+=(git)
      run apt-get update -q
      run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" ;;
    *)
      local need=git; [ $want_python = 1 ] && need="Python 3.11 or newer"
      echo "$0: no $need on this node and no known package manager for ID='${ID:-}' (/etc/os-release):" \
           "use a ParallelCluster OS (alinux2023, ubuntu2204/2404, rhel8/9, rocky8/9)" >&2
      exit 1 ;;
  esac
  echo "[node_base] installed ${pkgs[*]}"
}

shared_directories() {
  local base=$ROOT$SHARED group
  if [ ! -d "$base" ]; then
    echo "$0: $SHARED is not mounted: the FSx file system must be mounted before this action runs" >&2; exit 1
  fi
  group=$(id -gn "$CLUSTER_USER")
  # install -d changes the mode of an existing directory too: FSx may have imported these from S3 as root's 0755
  install -d -m 1777 "$base/checkpoints" "$base/runs"
  install -d -m 0755 "$base/users"
  local d
  for d in "$base/users/$CLUSTER_USER" "$base/t5-failover"; do
    # never re-own an existing directory (a recreated cluster finds its old checkout and files in place)
    [ -e "$d" ] || install -d -m 0755 -o "$CLUSTER_USER" -g "$group" "$d"
  done
  echo "[node_base] $SHARED/checkpoints and $SHARED/runs writable by every user (sticky);" \
       "$SHARED/users/$CLUSTER_USER and $SHARED/t5-failover belong to $CLUSTER_USER"
}

install_packages
if [ "$ROLE" = head ]; then shared_directories; fi

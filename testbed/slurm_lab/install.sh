#!/usr/bin/env bash
# install.sh: install what the lab runs (Debian bookworm's Slurm 22.05, munge, iproute2, util-linux) with
# apt-get when any of it is missing; does nothing when all is present. Needs root. up.sh calls it; tests that
# only need the Slurm client (scontrol) call it too.
set -euo pipefail
log() { echo "[slurm-lab $(date +%T)] $*" >&2; }
die() { echo "[slurm-lab] ERROR: $*" >&2; exit 1; }

missing=()
for b in munged mungekey slurmctld slurmd sbatch scontrol ip nsenter unshare; do
  command -v "$b" >/dev/null || missing+=("$b")
done
((${#missing[@]})) || exit 0
[[ $EUID -eq 0 ]] || die "missing ${missing[*]}: installing Slurm needs root (or install slurmctld slurmd slurm-client munge yourself)"
command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install Slurm 22.05 + munge yourself"
log "installing slurmctld slurmd slurm-client munge (apt-get; missing: ${missing[*]})"
pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux procps)
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
  || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${pkgs[@]}" >/dev/null; } \
  || die "apt-get install ${pkgs[*]} failed"

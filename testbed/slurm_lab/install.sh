#!/usr/bin/env bash
# install.sh: install what the lab runs (Debian bookworm's Slurm 22.05, munge, iproute2, util-linux) with
# apt-get when any of it is missing; does nothing when all is present. Needs root. up.sh calls it; tests that
# only need the Slurm client (scontrol) call it too.
set -euo pipefail
log() { echo "[slurm-lab $(date +%T)] $*" >&2; }
die() { echo "[slurm-lab] ERROR: $*" >&2; exit 1; }

find_missing() {
  missing=()
  for b in munged mungekey slurmctld slurmd sbatch scontrol ip nsenter unshare; do
    command -v "$b" >/dev/null || missing+=("$b")
  done
}
find_missing
((${#missing[@]})) || exit 0
[[ $EUID -eq 0 ]] || die "missing ${missing[*]}: installing Slurm needs root (or install slurmctld slurmd slurm-client munge yourself)"
# One installer at a time (a lab coming up while a test wants scontrol): the second waits, then finds it installed.
exec 9>/var/lock/t5-failover-slurm-lab-install.lock
flock 9
find_missing
((${#missing[@]})) || exit 0
command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install Slurm 22.05 + munge yourself"
log "installing slurmctld slurmd slurm-client munge (apt-get; missing: ${missing[*]})"
pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux procps)
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -o DPkg::Lock::Timeout=300)  # wait for another apt/dpkg (e.g. unattended upgrades) instead of failing
"${apt[@]}" install -y --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
  || { "${apt[@]}" update >/dev/null && "${apt[@]}" install -y --no-install-recommends "${pkgs[@]}" >/dev/null; } \
  || die "apt-get install ${pkgs[*]} failed"

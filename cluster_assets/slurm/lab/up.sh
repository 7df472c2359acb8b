#!/usr/bin/env bash
# up.sh: start the lab (a real Slurm 22.05 cluster on this machine). Idempotent: a healthy lab with the
# same settings is left alone; anything else is torn down (our processes only) and started fresh.
#   SLAB_NODES=2 SLAB_MODE=auto|netns|loopback [SLAB_ROOT=...] up.sh
# Installs Debian's slurmctld/slurmd/slurm-client/munge with apt-get when missing. Needs root.
set -euo pipefail
SLAB_IGNORE_SAVED=1   # `up` takes its settings from the environment, not from the previous run
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
unset SLAB_IGNORE_SAVED
T0=$(date +%s%N)

[[ $EUID -eq 0 ]] || die "the Slurm lab needs root (munge, slurmd launching jobs, network namespaces); run as root"
[[ "$SLAB_NODES" =~ ^[1-9][0-9]?$ ]] || die "SLAB_NODES=$SLAB_NODES: expected 1..99 nodes"
[[ "$SLAB_MODE" =~ ^(auto|netns|loopback)$ ]] || die "SLAB_MODE=$SLAB_MODE: expected auto, netns or loopback"
(( ${#SLAB_PFX} <= 8 )) || die "SLAB_PFX=$SLAB_PFX is too long for link names (max 8 characters)"
(( ${#MSOCK} <= 100 )) || die "SLAB_ROOT=$R is too long for munge's socket path ($MSOCK, max 100 characters); set a shorter SLAB_ROOT"

# ---------- packages (Debian bookworm: slurm-wlm 22.05) ----------
missing=()
for b in munged mungekey slurmctld slurmd sbatch ip nsenter unshare; do command -v "$b" >/dev/null || missing+=("$b"); done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install Slurm 22.05 + munge yourself"
  log "installing slurmctld slurmd slurm-client munge (apt-get; missing: ${missing[*]})"
  pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux procps)
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${pkgs[@]}" >/dev/null; } \
    || die "apt-get install ${pkgs[*]} failed"
fi

# ---------- mode ----------
if [[ "$SLAB_MODE" == auto ]]; then
  probe="${SLAB_PFX}-probe"
  if ip netns add "$probe" 2>/dev/null && ip netns del "$probe" 2>/dev/null && unshare --uts --mount true 2>/dev/null; then
    SLAB_MODE=netns
  else
    ip netns del "$probe" 2>/dev/null || true
    log "network namespaces unavailable here: falling back to loopback mode (several slurmd on 127.0.0.1)"
    SLAB_MODE=loopback
  fi
fi
WANT="mode=$SLAB_MODE nodes=$SLAB_NODES cpus=$SLAB_CPUS net=$SLAB_NET pfx=$SLAB_PFX ports=$SLAB_CTLD_PORT/$SLAB_SLURMD_PORT timeout=$SLAB_SLURMD_TIMEOUT cred=$SLAB_CRED_EXPIRE"

healthy() {
  [[ "$(cat "$R/run/settings" 2>/dev/null)" == "$WANT" ]] || return 1
  pid_alive "$(pidfile_pid "$R/run/munged.pid")" || return 1
  pid_alive "$(pidfile_pid "$R/run/slurmctld.pid")" || return 1
  local i; for ((i = 1; i <= SLAB_NODES; i++)); do pid_alive "$(pidfile_pid "$R/run/slurmd-n$i.pid")" || return 1; done
  timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
  local st; st="$(timeout 10 sinfo -h -N -o '%t' 2>/dev/null)"
  [[ -n "$st" ]] && ! grep -qvE '^(idle|alloc|mix|comp)$' <<<"$st"
}
if healthy; then log "already up ($WANT)"; exit 0; fi
if [[ -e "$R/run" || -e "$R/lab.env" ]]; then "$SLAB_LAB_DIR/down.sh" >/dev/null 2>&1 || true; fi

mkdir -p "$R"/{etc,run,log,state/ctld,shared}
chmod 755 "$R" "$R/run"
echo "$SLAB_MODE" > "$R/run/mode"
cat > "$R/lab.env" <<EOF
# written by up.sh: the settings of the running lab (read by down/fault/status)
SLAB_NODES=$SLAB_NODES
SLAB_MODE=$SLAB_MODE
SLAB_CPUS=$SLAB_CPUS
SLAB_NET=$SLAB_NET
SLAB_PFX=$SLAB_PFX
SLAB_CTLD_PORT=$SLAB_CTLD_PORT
SLAB_SLURMD_PORT=$SLAB_SLURMD_PORT
SLAB_SLURMD_TIMEOUT=$SLAB_SLURMD_TIMEOUT
SLAB_CRED_EXPIRE=$SLAB_CRED_EXPIRE
EOF
HOST_S="$(hostname -s)"

# ---------- network (netns mode): a bridge on the host, one veth pair per node ----------
NODELINES=""
if [[ "$SLAB_MODE" == netns ]]; then
  CTL_ADDR="$SLAB_NET.1"
  br="${SLAB_PFX}-br"
  ip link add "$br" type bridge || die "cannot create bridge $br (another lab with SLAB_PFX=$SLAB_PFX?)"
  ip addr add "$CTL_ADDR/24" dev "$br"
  ip link set "$br" up
  for ((i = 1; i <= SLAB_NODES; i++)); do
    ns="$(node_ns "$i")" h="${SLAB_PFX}-h$i" c="${SLAB_PFX}-c$i"
    ip netns add "$ns"
    ip link add "$h" type veth peer name "$c"
    ip link set "$c" netns "$ns"
    ip link set "$h" master "$br"
    ip link set "$h" up
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev "$c"
    ip -n "$ns" link set "$c" up
    ip -n "$ns" link set lo up
    NODELINES+="NodeName=n$i NodeHostname=n$i NodeAddr=$(node_ip "$i") CPUs=$SLAB_CPUS RealMemory=1000 State=UNKNOWN"$'\n'
  done
  { echo "127.0.0.1 localhost"; echo "$CTL_ADDR $HOST_S slab-ctl"
    for ((i = 1; i <= SLAB_NODES; i++)); do echo "$(node_ip "$i") n$i"; done; } > "$R/etc/hosts"
else
  CTL_ADDR=127.0.0.1
  for ((i = 1; i <= SLAB_NODES; i++)); do
    NODELINES+="NodeName=n$i NodeHostname=$HOST_S NodeAddr=127.0.0.1 Port=$((SLAB_SLURMD_PORT + i - 1)) CPUs=$SLAB_CPUS RealMemory=1000 State=UNKNOWN"$'\n'
  done
fi

# ---------- munge: private key and socket ----------
[[ -s "$R/etc/munge.key" ]] || mungekey --create --keyfile="$R/etc/munge.key" 2>/dev/null \
  || dd if=/dev/urandom of="$R/etc/munge.key" bs=1024 count=1 status=none
chmod 400 "$R/etc/munge.key"
munged --force --socket="$MSOCK" --key-file="$R/etc/munge.key" --pid-file="$R/run/munged.pid" \
       --log-file="$R/log/munged.log" --seed-file="$R/run/munged.seed" \
  || die "munged failed to start; see $R/log/munged.log"

# ---------- slurm.conf ----------
cat > "$CONF" <<EOF
# generated by cluster_assets/slurm/lab/up.sh ($WANT)
ClusterName=slab
SlurmctldHost=$HOST_S($CTL_ADDR)
SlurmctldPort=$SLAB_CTLD_PORT
SlurmdPort=$SLAB_SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job is held before it may start again (default 120 s, min 5)
AuthInfo=socket=$MSOCK,cred_expire=$SLAB_CRED_EXPIRE
StateSaveLocation=$R/state/ctld
SlurmdSpoolDir=$R/state/%n
SlurmctldPidFile=$R/run/slurmctld.pid
SlurmdPidFile=$R/run/slurmd-%n.pid
SlurmctldLogFile=$R/log/slurmctld.log
SlurmdLogFile=$R/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups and no accounting daemon: runs in containers and small VMs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# job history without slurmdbd: one line per ended incarnation (NODE_FAIL, REQUEUED, COMPLETED, ...)
JobCompType=jobcomp/filetxt
JobCompLoc=$R/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
# fast failure detection and recovery: a dead node is DOWN in ~2x SlurmdTimeout, its job requeued
SlurmdTimeout=$SLAB_SLURMD_TIMEOUT
SlurmctldTimeout=10
MessageTimeout=3
TCPTimeout=2
KillWait=5
UnkillableStepTimeout=10
ReturnToService=2
JobRequeue=1
MinJobAge=900
InactiveLimit=0
MailProg=/bin/true
$NODELINES
PartitionName=debug Nodes=n[1-$SLAB_NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

# ---------- daemons ----------
env SLURM_CONF="$CONF" slurmctld -i || die "slurmctld failed to start; see $R/log/slurmctld.log"
for ((i = 1; i <= SLAB_NODES; i++)); do start_slurmd "$i" || die "slurmd n$i failed; see $R/log/slurmd-n$i.log"; done

cat > "$R/env.sh" <<EOF
# source this to use the lab's Slurm from a shell: sbatch, squeue, scontrol ...
export SLURM_CONF=$CONF
export SLAB_ROOT=$R
export SLAB_SHARED_DIR=$R/shared
EOF

t=$SECONDS
until timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; do
  (( SECONDS - t > 20 )) && { tail -n 20 "$R/log/slurmctld.log" >&2; die "slurmctld did not come up"; }
  sleep 0.2
done
wait_nodes 'idle' 40 || { tail -n 5 "$R"/log/slurmd-*.log >&2; die "nodes did not become idle"; }
echo "$WANT" > "$R/run/settings"   # written only after success: healthy() compares it
log "up in $(( ($(date +%s%N) - T0) / 1000000 )) ms: $WANT"
log "use it with: source $R/env.sh   (shared dir for jobs: $R/shared)"

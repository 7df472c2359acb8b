# lib.sh: settings and helpers shared by up.sh / down.sh / fault.sh / status.sh. Source it; don't run it.
#
# The lab is a real Slurm 22.05 cluster on this machine: munged + slurmctld on the host and one slurmd per
# "node" n1..nN, each in its own network + UTS + mount namespace (netns mode) or all on loopback with
# per-node ports (loopback mode). Everything it owns lives under $SLAB_ROOT; network namespaces and links
# carry the $SLAB_PFX prefix. Processes are found by PID files, namespace membership and a per-lab
# environment tag, never by name alone, so two labs (e.g. a user's and a test's) can run side by side.

SLAB_LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SLAB_REPO="$(cd "$SLAB_LAB_DIR/../.." && pwd)"
SLAB_ROOT="${SLAB_ROOT:-$SLAB_REPO/.slurm-lab}"
R="$SLAB_ROOT"

# Settings chosen by `up` are frozen in $R/lab.env so that fault/down/status act on the lab that is
# actually running, whatever the caller's environment says.
if [[ -s "$R/lab.env" && -z "${SLAB_IGNORE_SAVED:-}" ]]; then
  # shellcheck disable=SC1091
  source "$R/lab.env"
fi
# Defaults that must differ between labs (namespace/link prefix, subnet, ports) derive from the root, so two
# checkouts on one machine get two independent labs and `down` in one never touches the other's.
_SLAB_H="$(printf '%s' "$R" | cksum | cut -d' ' -f1)"
SLAB_NODES="${SLAB_NODES:-2}"                  # compute nodes n1..nN
SLAB_MODE="${SLAB_MODE:-auto}"                 # netns | loopback | auto (netns when namespaces work)
SLAB_CPUS="${SLAB_CPUS:-2}"                    # CPUs advertised per node (config_overrides: need not exist)
SLAB_NET="${SLAB_NET:-10.77.$((_SLAB_H % 250 + 1))}"  # netns mode: /24 on a bridge; .1 = controller, .1X = nX
SLAB_PFX="${SLAB_PFX:-sl$(printf '%04x' $((_SLAB_H % 65536)))}"  # netns/link name prefix (<= 8 chars: IFNAMSIZ)
SLAB_CTLD_PORT="${SLAB_CTLD_PORT:-$((16000 + (_SLAB_H % 300) * 10))}"
SLAB_SLURMD_PORT="${SLAB_SLURMD_PORT:-$((SLAB_CTLD_PORT + 1))}"  # netns: same port in every namespace; loopback: port+i-1
SLAB_SLURMD_TIMEOUT="${SLAB_SLURMD_TIMEOUT:-6}" # a dead node is marked DOWN ~2x this after it dies
SLAB_CRED_EXPIRE="${SLAB_CRED_EXPIRE:-5}"      # >= 5 (Slurm's minimum); a requeued job is held cred_expire+1 s before rerun

CONF="$R/etc/slurm.conf"
MSOCK="$R/run/munge.sock"
export SLURM_CONF="$CONF"

log()  { echo "[slurm-lab $(date +%T)] $*" >&2; }
die()  { echo "[slurm-lab] ERROR: $*" >&2; exit 1; }

node_name() { echo "n$1"; }
node_idx()  { local n="$1"; [[ "$n" =~ ^n([0-9]+)$ ]] || die "bad node name '$n' (expected n1..n$SLAB_NODES)"; echo "${BASH_REMATCH[1]}"; }
node_ns()   { echo "${SLAB_PFX}-n$1"; }
node_ip()   { echo "$SLAB_NET.$((10 + $1))"; }
node_tag()  { echo "$SLAB_PFX:$R:n$1"; }        # SLAB_NODE_TAG of that node's slurmd (inherited by slurmstepd)
cur_mode()  { cat "$R/run/mode" 2>/dev/null || true; }
pidfile_pid() { [[ -s "$1" ]] && tr -dc '0-9' < "$1" || true; }

# Alive and not a zombie: here PID 1 may never reap orphans, so `kill -0` alone succeeds on zombies.
pid_alive() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null \
    && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

# PIDs whose environment contains the exact entry $1 (a fixed string "NAME=value").
pids_with_env() {
  local want="$1" f
  for f in /proc/[0-9]*/environ; do
    grep -qzxF -- "$want" "$f" 2>/dev/null && { f="${f#/proc/}"; echo "${f%/environ}"; }
  done
}

# The PIDs read from stdin plus all their descendants (job tasks are children of slurmstepd, torchrun
# workers children of the agent, data-loader workers children of the workers).
with_descendants() {
  local roots; roots="$(grep -E '^[0-9]+$' || true)"
  [[ -z "$roots" ]] && return 0
  ps -e -o pid=,ppid= | awk -v roots="$roots" '
    BEGIN { n = split(roots, r, "\n"); for (i = 1; i <= n; i++) q[c++] = r[i] }
    { kids[$2] = kids[$2] " " $1 }
    END { for (i = 0; i < c; i++) { p = q[i]; if (seen[p]++) continue; print p
                                    m = split(kids[p], k, " "); for (j = 1; j <= m; j++) q[c++] = k[j] } }'
}

# Every process of node nX: its slurmd and slurmstepds (tagged by environment), their descendants (job
# tasks, torchrun agents, workers) and, in netns mode, anything else inside its network namespace.
node_pids() {
  local i; i="$(node_idx "$1")"
  { pidfile_pid "$R/run/slurmd-n$i.pid"; echo; pids_with_env "SLAB_NODE_TAG=$(node_tag "$i")"; } | with_descendants
  if [[ "$(cur_mode)" == netns ]]; then ip netns pids "$(node_ns "$i")" 2>/dev/null || true; fi
}
node_pids_alive() {
  local p
  for p in $(node_pids "$1" | sort -un); do
    if [[ "$p" != "$$" ]] && pid_alive "$p"; then echo "$p"; fi
  done
  return 0
}

# Start slurmd for node index i. netns mode: inside the node's namespace with its own hostname and a
# private /etc/hosts. nsenter --net, not `ip netns exec`: the latter remounts /sys and hides
# /sys/fs/cgroup, which slurmd 22.05 insists on.
start_slurmd() {
  local i="$1" n; n="$(node_name "$i")"
  mkdir -p "$R/state/$n"
  rm -f "$R/run/slurmd-$n.pid"
  if [[ "$(cur_mode)" == netns ]]; then
    nsenter --net="/run/netns/$(node_ns "$i")" unshare --uts --mount --propagation private \
      sh -c "mount --bind '$R/etc/hosts' /etc/hosts && hostname '$n' \
             && exec env SLAB_NODE_TAG='$(node_tag "$i")' SLURM_CONF='$CONF' slurmd -N '$n'"
  else
    env SLAB_NODE_TAG="$(node_tag "$i")" SLURM_CONF="$CONF" slurmd -N "$n"
  fi
}

# The membership store: 3 etcd members on the lab's host side, off every compute node, as the clusters run them
# (testbed/slurm_lab/etcd.py; netns mode: 3 addresses on the host's bridge, loopback mode: 3 loopback ports).
# Tagged by environment (SLAB_STORE_TAG) so down.sh finds them; the project venv's python runs the manager.
store_tag() { echo "$SLAB_PFX:$R:store"; }
store_hosts() {
  if [[ "$(cur_mode)" == netns ]]; then echo "$SLAB_NET.2,$SLAB_NET.3,$SLAB_NET.4"; else echo "127.0.0.1,127.0.0.1,127.0.0.1"; fi
}
lab_python() {
  local py="$SLAB_REPO/.venv/bin/python"
  [[ -x "$py" ]] || py="$("$SLAB_REPO/scripts/venv.sh")" || die "no project venv for the lab's etcd (scripts/venv.sh)"
  echo "$py"
}
etcd_ctl() { PYTHONPATH="$SLAB_REPO" SLAB_STORE_TAG="$(store_tag)" "$(lab_python)" "$SLAB_LAB_DIR/etcd.py" "$@" --root "$R"; }
store_pids() { [[ -s "$R/etcd/state.json" ]] && etcd_ctl pids 2>/dev/null || true; }
start_store() {
  rm -rf "$R/etcd"
  etcd_ctl start --hosts "$(store_hosts)" >> "$R/log/etcd-start.log" 2>&1 < /dev/null \
    || { tail -n 20 "$R/log/etcd-start.log" "$R/etcd/etcd.log" >&2 2>/dev/null; die "the lab's etcd did not come up on $(store_hosts)"; }
}

# Wait until every listed node's short state (sinfo %t) matches the regex; default all nodes.
wait_nodes() {
  local re="$1" to="${2:-30}" nodes="${3:-}" t0=$SECONDS out=""
  while (( SECONDS - t0 < to )); do
    out="$(sinfo -h -N ${nodes:+-n "$nodes"} -o '%N %t' 2>/dev/null | sort -u)"
    if [[ -n "$out" ]] && ! grep -qvE " ($re)\$" <<<"$out"; then return 0; fi
    sleep 0.2
  done
  log "timeout after ${to}s waiting for ${nodes:-all nodes} to match '$re'; have: $(echo $out)"
  return 1
}

node_state() { scontrol show node "$1" -o 2>/dev/null | grep -oE ' State=[^ ]+' | cut -d= -f2; }

# Our daemons even when PID files are gone: slurm/munge binaries whose command line names $R or whose
# environment carries this lab's SLURM_CONF or node tag.
our_daemons() {
  local d p i tags=(-e "SLURM_CONF=$CONF")
  for ((i = 1; i <= SLAB_NODES; i++)); do tags+=(-e "SLAB_NODE_TAG=$(node_tag "$i")"); done
  for d in /proc/[0-9]*; do
    p="${d#/proc/}"
    if grep -qzxF "SLAB_STORE_TAG=$(store_tag)" "$d/environ" 2>/dev/null; then echo "$p"; continue; fi
    case "$(cat "$d/comm" 2>/dev/null)" in munged|slurmctld|slurmd|slurmstepd|slurmscriptd) ;; *) continue ;; esac
    if tr '\0' ' ' < "$d/cmdline" 2>/dev/null | grep -qF -- "$R/" \
       || grep -qzxF "${tags[@]}" "$d/environ" 2>/dev/null; then echo "$p"; fi
  done
}

# A slow node (fault.sh slow): its processes in a CPU cgroup with a CFS quota. The kernel's netem (a slow link)
# was the other way; kernels without sch_netem, and labs that cannot modprobe it, are common, while the cpu
# controller is there wherever containers run. cgroup v1 (/sys/fs/cgroup/cpu) or v2 (cpu enabled for the root's
# children). Prints the controller's directory, or says why there is none and fails.
cpu_cgroup_root() {
  if [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
    echo /sys/fs/cgroup/cpu
  elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    echo /sys/fs/cgroup
  else
    echo "no cpu cgroup controller here (cgroup v1 /sys/fs/cgroup/cpu, or v2 with cpu in /sys/fs/cgroup/cgroup.subtree_control)" >&2
    return 1
  fi
}
node_cgroup() { echo "$1/${SLAB_PFX}-n$2"; }   # cgroup root, node index
# A node's CPU: PERCENT of one CPU at most (a CFS quota over 10 ms periods: short, so that a tiny step's compute is
# throttled too) and PERCENT of a node's weight when the CPUs are contended (cpu.shares of 1024; v2: cpu.weight of
# 100). The quota alone does not bind on a busy machine, where every process gets less than it anyway; the weight
# does, against the other nodes' cgroups at full weight. 100 = a node at full speed (no quota).
set_node_cpu() {
  local cg="$1" pct="$2" period=10000
  if [[ -f "$cg/cpu.cfs_quota_us" ]]; then
    echo "$period" > "$cg/cpu.cfs_period_us"
    if (( pct < 100 )); then echo $((period * pct / 100)) > "$cg/cpu.cfs_quota_us"; else echo -1 > "$cg/cpu.cfs_quota_us"; fi
    echo $(( 1024 * pct / 100 > 2 ? 1024 * pct / 100 : 2 )) > "$cg/cpu.shares"
  else
    if (( pct < 100 )); then echo "$((period * pct / 100)) $period" > "$cg/cpu.max"; else echo "max $period" > "$cg/cpu.max"; fi
    echo "$pct" > "$cg/cpu.weight"
  fi
}
# Every process of node index $2 into the cgroup $1, in up to $3 passes (the next for children forked while their
# parents moved; what a moved process forks later is born in the cgroup).
move_node_to_cgroup() {
  local cg="$1" n pass; n="$(node_name "$2")"
  for ((pass = 0; pass < ${3:-3}; pass++)); do
    local left=0 q
    for q in $(node_pids_alive "$n"); do
      grep -qxF "$q" "$cg/cgroup.procs" && continue
      echo "$q" > "$cg/cgroup.procs" 2>/dev/null || true; left=1
    done
    (( left )) || break
  done
}
# Remove a node's CPU cgroup: its processes back to the controller's root first (down.sh, unslow, revive).
drop_node_cgroup() {
  local root cg p
  root="$(cpu_cgroup_root 2>/dev/null)" || return 0
  cg="$(node_cgroup "$root" "$1")"
  [[ -d "$cg" ]] || return 0
  for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do echo "$p" > "$root/cgroup.procs" 2>/dev/null || true; done
  rmdir "$cg" 2>/dev/null || { sleep 0.2; rmdir "$cg" 2>/dev/null; } || log "could not remove $cg"
  rm -f "$R/run/slow-n$1"
}

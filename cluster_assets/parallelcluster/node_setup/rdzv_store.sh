#!/bin/bash
# Install and start the systemd unit that keeps the job-independent rendezvous store running on the
# ParallelCluster head node: `python -m training.rdzv_store --host <head node private IP> --port PORT`, restarted
# whenever it stops. Run by ParallelCluster as root (HeadNode.CustomActions.OnNodeConfigured):
#   rdzv_store.sh PORT UNIT PYTHON WORKDIR
#     PORT     TCP port (cluster_facts.RDZV_STORE_PORT, 29400); the stack's security group admits it from the
#              compute nodes only
#     UNIT     systemd unit name (cluster_facts.RDZV_STORE_UNIT, t5-rdzv-store.service)
#     PYTHON   the interpreter in the default checkout, e.g. /fsx/t5-failover/.venv/bin/python
#     WORKDIR  the default checkout (python -m training.rdzv_store is imported from there)
#
# The unit runs a small launcher (LAUNCHER below) that takes the checkout from T5_CHECKOUT in the optional
# ENV_FILE (/etc/t5-failover/rdzv-store.env), else WORKDIR, and its venv at the same place below it as PYTHON is
# below WORKDIR. A checkout elsewhere (say /fsx/users/alice/t5-failover) is chosen, once, with
# `sudo cluster_assets/parallelcluster/node_setup/rdzv_store_checkout.sh "$PWD"` run in it (docs/slurm.md).
# The code comes from that checkout (docs/slurm.md sets it up after the deploy), so the unit may start before it
# exists: the launcher then says in one line what is missing and how to fix it (journalctl, systemctl status) and
# exits 1, and the unit retries every 15 s forever (no start limit) until it appears. The store only binds
# --host, the head node's private address from IMDSv2; the unit also refuses IP traffic from outside the VPC's
# CIDR blocks (IPAddressAllow).
#
# T5_SETUP_ROOT=DIR (tests, inspection): write the unit under DIR instead of /, log the systemctl commands to
# DIR/commands.log instead of running them, and take the address and CIDRs from T5_SETUP_PRIVATE_IP and
# T5_SETUP_VPC_CIDRS (space separated) instead of IMDS.
set -euo pipefail

usage() { echo "usage: $0 PORT UNIT PYTHON WORKDIR" >&2; exit 2; }
[ $# -eq 4 ] || usage
PORT=$1 UNIT=$2 PYTHON=$3 WORKDIR=$4
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  echo "$0: PORT '$PORT' must be a TCP port 1-65535" >&2; exit 2
fi
if ! [[ "$UNIT" =~ ^[A-Za-z0-9_.@-]+\.service$ ]]; then
  echo "$0: UNIT '$UNIT' must be a systemd service name such as t5-rdzv-store.service" >&2; exit 2
fi
for p in "$PYTHON" "$WORKDIR"; do
  # both go into ExecStart/WorkingDirectory unquoted: absolute, no whitespace, no '%' (systemd specifiers)
  if ! [[ "$p" =~ ^/[^[:space:]%\"\'\\]*$ ]]; then
    echo "$0: '$p' must be an absolute path without spaces, quotes, backslashes or '%'" >&2; exit 2
  fi
done
if [[ "$PYTHON" != "${WORKDIR%/}"/* ]]; then
  echo "$0: PYTHON '$PYTHON' must be inside WORKDIR '$WORKDIR' (the checkout's own venv)" >&2; exit 2
fi
VENV_PYTHON=${PYTHON#"${WORKDIR%/}"/}  # e.g. .venv/bin/python: the same place in any checkout

ROOT=${T5_SETUP_ROOT:-}
LAUNCHER=/usr/local/libexec/t5-rdzv-store
ENV_FILE=/etc/t5-failover/rdzv-store.env
run() {  # a command that changes the running system: logged instead under T5_SETUP_ROOT
  if [ -n "$ROOT" ]; then echo "$*" >> "$ROOT/commands.log"; else "$@"; fi
}

imds() {  # IMDSv2: a session token first (ParallelCluster requires v2), then the metadata path
  local token
  token=$(curl -sSf --retry 5 -X PUT http://169.254.169.254/latest/api/token \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
  curl -sSf --retry 5 -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}

if [ -n "$ROOT" ]; then
  HOST_IP=${T5_SETUP_PRIVATE_IP:?T5_SETUP_ROOT needs T5_SETUP_PRIVATE_IP}
  VPC_CIDRS=${T5_SETUP_VPC_CIDRS:?T5_SETUP_ROOT needs T5_SETUP_VPC_CIDRS}
else
  HOST_IP=$(imds local-ipv4)
  MAC=$(imds mac)
  VPC_CIDRS=$(imds "network/interfaces/macs/$MAC/vpc-ipv4-cidr-blocks" | tr '\n' ' ')
fi
if ! [[ "$HOST_IP" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]]; then
  echo "$0: private address '$HOST_IP' from IMDS is not an IPv4 address" >&2; exit 1
fi
read -r -a CIDRS <<< "$VPC_CIDRS"
if [ ${#CIDRS[@]} -eq 0 ]; then echo "$0: no VPC CIDR block from IMDS" >&2; exit 1; fi
for c in "${CIDRS[@]}"; do
  [[ "$c" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$ ]] || { echo "$0: VPC CIDR '$c' is malformed" >&2; exit 1; }
done

install -d -m 0755 "$ROOT$(dirname "$LAUNCHER")"
umask 022
# The launcher runs as the unit's unprivileged user; every failure is one line naming the fix, exit 1 (retried).
cat > "$ROOT$LAUNCHER.tmp" <<LAUNCH
#!/bin/bash
# Written by cluster_assets/parallelcluster/node_setup/rdzv_store.sh: start the rendezvous store from the checkout
# T5_CHECKOUT ($ENV_FILE, written by rdzv_store_checkout.sh), else $WORKDIR.
set -u
checkout=\${T5_CHECKOUT:-$WORKDIR}
py=\$checkout/$VENV_PYTHON
fail() { echo "$UNIT: \$*; retrying in 15 s" >&2; exit 1; }
other="or, for a checkout elsewhere, run there: sudo cluster_assets/parallelcluster/node_setup/rdzv_store_checkout.sh \\\$PWD (docs/slurm.md)"
[ -f "\$checkout/training/rdzv_store.py" ] ||
  fail "no repository checkout at \$checkout (or this service's unprivileged user cannot read it): clone the repository there, \$other"
[ -x "\$py" ] || fail "no venv at \$py: run scripts/venv.sh in \$checkout, \$other"
"\$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  fail "\$py is \$("\$py" --version 2>&1), the project needs Python 3.11 or newer: rm -rf \$checkout/.venv and run scripts/venv.sh there again"
cd "\$checkout" || fail "cannot enter \$checkout"
echo "$UNIT: serving from \$checkout (\$py)" >&2
exec "\$py" -m training.rdzv_store --host "\$1" --port "\$2"
LAUNCH
chmod 0755 "$ROOT$LAUNCHER.tmp"
mv -f "$ROOT$LAUNCHER.tmp" "$ROOT$LAUNCHER"

UNIT_DIR=$ROOT/etc/systemd/system
install -d -m 0755 "$UNIT_DIR"
cat > "$UNIT_DIR/$UNIT.tmp" <<UNITFILE
# Written by cluster_assets/parallelcluster/node_setup/rdzv_store.sh (ParallelCluster custom action).
[Unit]
Description=t5-failover rendezvous store for the Slurm jobs' agents ($HOST_IP:$PORT)
Documentation=file:$WORKDIR/docs/slurm.md
After=network-online.target remote-fs.target
Wants=network-online.target
# Never give up: the store must come back whenever it can (a job's agents fail without it).
StartLimitIntervalSec=0

[Service]
Type=simple
Environment=T5_CHECKOUT=$WORKDIR
# Another checkout: T5_CHECKOUT=<path> here (rdzv_store_checkout.sh writes it).
EnvironmentFile=-$ENV_FILE
ExecStart=$LAUNCHER $HOST_IP $PORT
Restart=always
RestartSec=15
Environment=PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/var/cache/t5-rdzv-store
# An unprivileged throw-away user with a read-only view of the system: the store needs only its socket.
DynamicUser=yes
CacheDirectory=t5-rdzv-store
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
# Defence in depth behind the security group: IP traffic only with this VPC and this host.
IPAddressDeny=any
IPAddressAllow=localhost ${CIDRS[*]}

[Install]
WantedBy=multi-user.target
UNITFILE
mv -f "$UNIT_DIR/$UNIT.tmp" "$UNIT_DIR/$UNIT"

run systemctl daemon-reload
run systemctl enable "$UNIT"
# --no-block: on a new cluster the repository is not on FSx yet, the first start fails its check and a
# waiting start would fail this custom action (and with it the cluster); the unit retries on its own.
run systemctl restart --no-block "$UNIT"
echo "[rdzv_store] $UNIT installed: $LAUNCHER $HOST_IP $PORT (python -m training.rdzv_store from $WORKDIR or $ENV_FILE's T5_CHECKOUT)"
echo "[rdzv_store] check: systemctl status ${UNIT%.service}; <checkout>/$VENV_PYTHON -m training.rdzv_store --check $HOST_IP:$PORT"

#!/bin/bash
# Set up one etcd member of the ParallelCluster coordinator (run as root by boot.sh, at every boot: t5-etcd-setup.service):
#   member.sh INDEX IPS CLIENT_PORT PEER_PORT VERSION ARCH SHA256 MEMBERS_SECRET CLIENT_SECRET REGION ASSET_DIR ROOT_SECRET
#     INDEX           this member's place in IPS (0, 1, 2); member 0 also makes the TLS material once
#     IPS             every member's private address, comma separated (the stack's fixed network interfaces)
#     CLIENT_PORT / PEER_PORT   2379 / 2380: the security group admits the head and compute nodes on the first,
#                     the members on the second
#     VERSION ARCH SHA256       the etcd release (stacks/versions.py): the tarball from etcd's GitHub releases is
#                     unpacked only when its SHA-256 matches
#     MEMBERS_SECRET / CLIENT_SECRET  Secrets Manager secrets (tls.py): the members' material, the clients'
#     REGION          their region
#     ASSET_DIR       where boot.sh put tls.py, certs.py and the start-time repair's modules (training/...)
#     ROOT_SECRET     Secrets Manager secret with etcd root's password: the start-time repair's login
#
# Installs etcd (skipped when the pinned version is there), gets this member's TLS material (tls.py install; member
# 0 runs tls.py init first), and writes and starts the systemd unit t5-etcd.service: TLS for clients and peers,
# client certificates required, JWT auth tokens any member accepts, election timing of the local cluster
# (training/launch/rendezvous/members.py). The data directory /var/lib/t5-etcd outlives reboots: a member that
# comes back rejoins with its data (--initial-cluster-state is ignored once the directory exists). The unit starts
# etcd through the start-time repair (training/launch/rendezvous/member_repair.py, as root: tls.py install writes
# root's client certificate and password): a member whose data is gone (a new root volume, a replaced instance,
# a wiped directory) while the other two run removes its old entry, adds itself again and starts "existing".
#
# The member listens on its fixed address (IPS[INDEX], the stack's interface member_address.sh attached), but its
# own connections to the other members leave from the instance's primary address, which a replacement changes:
# the peers do not match a peer's certificate against its source address
# (--experimental-peer-skip-client-san-verification; still required: a certificate of the members' CA, and the
# security group admits the peer port from the members only).
#
# T5_SETUP_ROOT=DIR (tests, inspection): write files under DIR instead of /, log the commands that change the
# system (dnf, useradd, systemctl) to DIR/commands.log instead of running them; `curl`, `aws` and `python3` are
# whatever PATH gives.
set -euo pipefail

usage() { echo "usage: $0 INDEX IPS CLIENT_PORT PEER_PORT VERSION ARCH SHA256 MEMBERS_SECRET CLIENT_SECRET REGION ASSET_DIR ROOT_SECRET" >&2; exit 2; }
[ $# -eq 12 ] || usage
INDEX=$1 IPS=$2 CLIENT_PORT=$3 PEER_PORT=$4 VERSION=$5 ARCH=$6 SHA256=$7 MEMBERS_SECRET=$8 CLIENT_SECRET=$9
REGION=${10} ASSET_DIR=${11} ROOT_SECRET=${12}

IFS=, read -r -a MEMBER_IPS <<< "$IPS"
for ip in "${MEMBER_IPS[@]}"; do
  [[ "$ip" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || { echo "$0: IPS: '$ip' is not an IPv4 address" >&2; exit 2; }
done
if ! [[ "$INDEX" =~ ^[0-9]+$ ]] || [ "$INDEX" -ge ${#MEMBER_IPS[@]} ]; then
  echo "$0: INDEX '$INDEX' must be 0..$((${#MEMBER_IPS[@]} - 1)) (a place in IPS)" >&2; exit 2
fi
for port in "$CLIENT_PORT" "$PEER_PORT"; do
  if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    echo "$0: port '$port' must be a TCP port 1-65535" >&2; exit 2
  fi
done
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "$0: VERSION '$VERSION' must look like 3.6.14" >&2; exit 2; }
case "$ARCH" in amd64|arm64) ;; *) echo "$0: ARCH '$ARCH' must be amd64 or arm64" >&2; exit 2 ;; esac
[[ "$SHA256" =~ ^[0-9a-f]{64}$ ]] || { echo "$0: SHA256 '$SHA256' must be 64 hex digits" >&2; exit 2; }

ROOT=${T5_SETUP_ROOT:-}
run() {  # a command that changes the running system: logged instead under T5_SETUP_ROOT
  if [ -n "$ROOT" ]; then echo "$*" >> "$ROOT/commands.log"; else "$@"; fi
}
NAME="m$INDEX"
MY_IP=${MEMBER_IPS[$INDEX]}
BIN=/usr/local/bin
TLS=/etc/t5-etcd/tls
UNIT=t5-etcd.service

# ------------------------------------------------------------------ the pinned etcd release
installed=$("$ROOT$BIN/etcd" --version 2>/dev/null | awk '/^etcd Version:/ {print $3}' || true)
if [ "$installed" != "$VERSION" ]; then
  dist="etcd-v$VERSION-linux-$ARCH"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  curl -fsSL --retry 5 -o "$tmp/$dist.tar.gz" "https://github.com/etcd-io/etcd/releases/download/v$VERSION/$dist.tar.gz"
  if ! echo "$SHA256  $tmp/$dist.tar.gz" | sha256sum -c --status; then
    echo "$0: $dist.tar.gz does not match the pinned SHA-256 $SHA256 (stacks/versions.py): not installed" >&2
    exit 1
  fi
  tar -xzf "$tmp/$dist.tar.gz" -C "$tmp"
  install -d -m 0755 "$ROOT$BIN"
  for b in etcd etcdctl etcdutl; do install -m 0755 "$tmp/$dist/$b" "$ROOT$BIN/$b"; done
  echo "[etcd member $NAME] installed etcd $VERSION ($ARCH)"
fi

# ------------------------------------------------------------------ TLS material
id etcd >/dev/null 2>&1 || run useradd --system --no-create-home --shell /sbin/nologin etcd
owner=(--owner etcd)
[ -n "$ROOT" ] && owner=()  # no etcd user under a scratch root
if [ "$INDEX" -eq 0 ]; then
  run dnf install -y python3-cryptography
  python3 "$ASSET_DIR/tls.py" init --region "$REGION" --members-secret "$MEMBERS_SECRET" \
    --client-secret "$CLIENT_SECRET" --ips "$IPS"
fi
# The start-time repair's client (training/launch/rendezvous/client.py) needs urllib3 2: Amazon Linux 2023's
# python3 is 3.9 with urllib3 1.25 (which refuses the client's TLS context for an IP address), and 2.5.0 is the
# last urllib3 for Python 3.9 (checked: the repair rejoins a local cluster on 3.9 with it). Pinned by its wheel's
# SHA-256, installed once into ASSET_DIR/lib, which the unit puts on PYTHONPATH.
URLLIB3=urllib3==2.5.0 URLLIB3_SHA256=e6b01673c0fa6a13e374b50871808eb3bf7046c4b125b216f6bf1cc604cff0dc
if [ ! -f "$ASSET_DIR/lib/urllib3/__init__.py" ]; then
  run dnf install -y python3-pip
  run python3 -m pip install --quiet --no-deps --only-binary=:all: --target "$ASSET_DIR/lib" --require-hashes \
    -r /dev/stdin <<< "$URLLIB3 --hash=sha256:$URLLIB3_SHA256"
fi
install -d -m 0755 "$ROOT/etc/t5-etcd"
python3 "$ASSET_DIR/tls.py" install --region "$REGION" --members-secret "$MEMBERS_SECRET" --index "$INDEX" \
  --dir "$ROOT$TLS" "${owner[@]}" ${T5_TLS_WAIT_S:+--wait-s "$T5_TLS_WAIT_S"} ${T5_TLS_POLL_S:+--poll-s "$T5_TLS_POLL_S"} \
  --root-secret "$ROOT_SECRET"

# ------------------------------------------------------------------ the systemd unit
cluster="" others=""
for i in "${!MEMBER_IPS[@]}"; do
  cluster+="${cluster:+,}m$i=https://${MEMBER_IPS[$i]}:$PEER_PORT"
  [ "$i" -eq "$INDEX" ] || others+="${others:+,}https://${MEMBER_IPS[$i]}:$CLIENT_PORT"
done
install -d -m 0755 "$ROOT/etc/systemd/system"
cat > "$ROOT/etc/systemd/system/$UNIT.tmp" <<UNITFILE
# Written by cluster_assets/parallelcluster/etcd/member.sh (the member's user data).
[Unit]
Description=t5-failover etcd member $NAME ($MY_IP): the Slurm jobs' membership store
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
Type=notify
# A new cluster is ready only once a majority runs: wait for it, however long the other members take.
TimeoutStartSec=0
User=etcd
StateDirectory=t5-etcd
StateDirectoryMode=0700
# The start-time repair (a member without data rejoins the running cluster), which then becomes etcd: the same
# process, so systemd's readiness notice (Type=notify) comes from etcd as before.
Environment=PYTHONPATH=$ASSET_DIR:$ASSET_DIR/lib PYTHONDONTWRITEBYTECODE=1
ExecStart=/usr/bin/python3 -m training.launch.rendezvous.member_repair --name $NAME \\
  --peer-url https://$MY_IP:$PEER_PORT --data-dir /var/lib/t5-etcd --endpoints $others \\
  --ca $TLS/ca.crt --cert $TLS/client.crt --key $TLS/client.key --password-file $TLS/root.password -- \\
  $BIN/etcd --name $NAME --data-dir /var/lib/t5-etcd \\
  --listen-client-urls https://$MY_IP:$CLIENT_PORT --advertise-client-urls https://$MY_IP:$CLIENT_PORT \\
  --listen-peer-urls https://$MY_IP:$PEER_PORT --initial-advertise-peer-urls https://$MY_IP:$PEER_PORT \\
  --initial-cluster $cluster --initial-cluster-state new --initial-cluster-token t5-failover-etcd \\
  --heartbeat-interval 100 --election-timeout 1000 \\
  --experimental-watch-progress-notify-interval 5s \\
  --auto-compaction-mode periodic --auto-compaction-retention 1h \\
  --cert-file $TLS/member.crt --key-file $TLS/member.key --client-cert-auth --trusted-ca-file $TLS/ca.crt \\
  --peer-cert-file $TLS/member.crt --peer-key-file $TLS/member.key --peer-client-cert-auth \\
  --peer-trusted-ca-file $TLS/ca.crt --experimental-peer-skip-client-san-verification \\
  --auth-token jwt,pub-key=$TLS/jwt.pub,priv-key=$TLS/jwt.key,sign-method=ES256,ttl=10m --bcrypt-cost 4
Restart=always
RestartSec=5
LimitNOFILE=65536
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
UNITFILE
mv -f "$ROOT/etc/systemd/system/$UNIT.tmp" "$ROOT/etc/systemd/system/$UNIT"
run systemctl daemon-reload
run systemctl enable "$UNIT"
# --no-block: the first member of a new cluster is ready only when the others are (the user data must not fail).
run systemctl restart --no-block "$UNIT"
echo "[etcd member $NAME] $UNIT: https://$MY_IP:$CLIENT_PORT (peers $cluster)"

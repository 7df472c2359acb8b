#!/bin/bash
# Give this instance its member's fixed address (run as root by boot.sh, at every boot, before member.sh):
#   member_address.sh ENI MY_IP REGION
#     ENI     the member's network interface (the stack's, in this member's subnet; eni-...)
#     MY_IP   its private address (what the certificates, the other members and the head node name)
#     REGION  its region
# Why: each member is an Auto Scaling group of one (stacks/components/etcd_members.py), and a group cannot launch
# an instance on a given interface; the address lives on an interface the stack owns, attached here as the
# instance's second one (device index 1). Amazon Linux 2023 (amazon-ec2-net-utils) configures a hot-plugged
# interface by itself, with a routing table for its own address, so replies leave from it.
#
# Already attached to this instance (a reboot): nothing to do. Attached to another instance (the one this
# instance replaces is still shutting down; EC2 detaches the interface when it has terminated): tried again every
# T5_ADDRESS_POLL_S (10 s) for T5_ADDRESS_WAIT_S (900 s), then exit 1 with the last refusal (the setup unit fails;
# the member's instance is replaced when it fails its health check, or the operator reruns it).
#
# Tests: `aws`, `curl` (the instance metadata service, at T5_IMDS_URL, default http://169.254.169.254) and `ip` are
# whatever PATH gives.
set -euo pipefail

usage() { echo "usage: $0 ENI MY_IP REGION" >&2; exit 2; }
[ $# -eq 3 ] || usage
ENI=$1 MY_IP=$2 REGION=$3
[[ "$ENI" =~ ^eni-[0-9a-f]{8,17}$ ]] || { echo "$0: ENI '$ENI' is not a network interface id (eni-...)" >&2; exit 2; }
[[ "$MY_IP" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || { echo "$0: MY_IP '$MY_IP' is not an IPv4 address" >&2; exit 2; }
IMDS=${T5_IMDS_URL:-http://169.254.169.254}
WAIT_S=${T5_ADDRESS_WAIT_S:-900}
POLL_S=${T5_ADDRESS_POLL_S:-10}
say() { echo "[etcd member address] $*"; }

token=$(curl -sSf --retry 5 -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 900")
meta() { curl -sSf --retry 5 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"; }
attached_here() {  # is ENI one of this instance's interfaces?
  local mac
  for mac in $(meta network/interfaces/macs/); do
    [ "$(meta "network/interfaces/macs/${mac%/}/interface-id")" = "$ENI" ] && return 0
  done
  return 1
}
has_address() { ip -o -4 addr show | grep -q " inet $MY_IP/"; }

instance=$(meta instance-id)
deadline=$((SECONDS + WAIT_S))
if attached_here; then
  say "$ENI ($MY_IP) is attached to $instance already"
else
  until refusal=$(aws ec2 attach-network-interface --region "$REGION" --network-interface-id "$ENI" \
                    --instance-id "$instance" --device-index 1 --output text 2>&1 >/dev/null); do
    if [ $SECONDS -ge $deadline ]; then
      echo "$0: could not attach $ENI ($MY_IP) to $instance in $WAIT_S s: $refusal" >&2
      exit 1
    fi
    say "waiting to attach $ENI: $refusal"
    sleep "$POLL_S"
  done
  say "$ENI ($MY_IP) attached to $instance"
fi
until has_address; do  # the interface is configured a few seconds after it appears
  if [ $SECONDS -ge $deadline ]; then
    echo "$0: $ENI is attached but $MY_IP is on no interface of $instance after $WAIT_S s (amazon-ec2-net-utils:" \
         "journalctl -u systemd-networkd)" >&2
    exit 1
  fi
  sleep 1
done
say "$MY_IP is up"

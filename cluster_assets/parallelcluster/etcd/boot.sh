#!/bin/bash
# Boot step of one ParallelCluster etcd member, at every boot (systemd oneshot t5-etcd-setup.service, before the
# member's t5-etcd.service, again 30 s after a failure; the user data installs it and starts it at the first boot):
#   boot.sh INDEX PARAMETER REGION ASSET_DIR
#     INDEX      this member's place (0, 1, 2)
#     PARAMETER  SSM parameter with the stack's member settings (JSON, stacks/components/etcd_members.py):
#                scripts {path under ASSET_DIR: s3 URL}, ips, interfaces, client_port, peer_port, version, arch,
#                sha256, members_secret, client_secret, root_secret
#     REGION     its region
#     ASSET_DIR  where the scripts go (/opt/t5-etcd)
# Why a parameter and not the user data: the user data is the same on every deploy (index, parameter name,
# region), so a redeploy that changes a script or the etcd version changes no member (CloudFormation would stop
# and start every member whose user data changed, all three at once: the coordinator down). The members take the
# new settings at their next boot, one at a time (docs/slurm.md, "Redeploying the members").
# Before member.sh: member_address.sh attaches this member's interface (its fixed address, the INDEX-th of
# interfaces and ips) to this instance, which its Auto Scaling group may have just launched in place of a lost one.
#
# Tests: `aws` and `python3` are whatever PATH gives; T5_SETUP_ROOT reaches member.sh (its own meaning there).
set -euo pipefail

usage() { echo "usage: $0 INDEX PARAMETER REGION ASSET_DIR" >&2; exit 2; }
[ $# -eq 4 ] || usage
INDEX=$1 PARAMETER=$2 REGION=$3 ASSET_DIR=$4

settings=$(aws ssm get-parameter --region "$REGION" --name "$PARAMETER" --query Parameter.Value --output text)
field() {  # KEY [SUBKEY]: one value of the settings
  python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2:]:
    v = v[k]
print(v, end="")' "$settings" "$@"
}
install -d -m 0755 "$ASSET_DIR"
# every script the settings name (a new one needs no change here, so none to the user data)
names=$(python3 -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])["scripts"]))' "$settings")
while IFS= read -r name; do
  case "$name" in /*|*..*) echo "$0: script path '$name' must stay under $ASSET_DIR" >&2; exit 2 ;; esac
  install -d -m 0755 "$(dirname "$ASSET_DIR/$name")"
  aws s3 cp --only-show-errors --region "$REGION" "$(field scripts "$name")" "$ASSET_DIR/$name"
done <<< "$names"
chmod 0755 "$ASSET_DIR/member.sh" "$ASSET_DIR/member_address.sh"
nth() {  # LIST: this member's entry of a comma-separated list
  local all; IFS=, read -r -a all <<< "$1"
  [ -n "${all[$INDEX]:-}" ] || { echo "$0: INDEX $INDEX has no entry in \"$1\"" >&2; exit 2; }
  echo "${all[$INDEX]}"
}
eni=$(nth "$(field interfaces)") my_ip=$(nth "$(field ips)")   # assignments: set -e stops on a missing entry
"$ASSET_DIR/member_address.sh" "$eni" "$my_ip" "$REGION"
exec "$ASSET_DIR/member.sh" "$INDEX" "$(field ips)" "$(field client_port)" "$(field peer_port)" \
  "$(field version)" "$(field arch)" "$(field sha256)" "$(field members_secret)" "$(field client_secret)" \
  "$REGION" "$ASSET_DIR" "$(field root_secret)"

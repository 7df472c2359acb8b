#!/bin/bash
# Point the head node's rendezvous store (systemd t5-rdzv-store.service, rdzv_store.sh) at a repository checkout
# other than the default /fsx/t5-failover, e.g. one under /fsx/users/<you>. Run it on the head node, in the
# checkout, once its venv exists (scripts/venv.sh):
#   sudo cluster_assets/parallelcluster/node_setup/rdzv_store_checkout.sh "$PWD" [UNIT]
# It checks that the store can run from CHECKOUT (the repository, a venv with Python >= 3.11, readable by the
# service's unprivileged user), writes T5_CHECKOUT=CHECKOUT to /etc/t5-failover/rdzv-store.env (which the unit
# reads) and restarts the unit (running jobs lose their rendezvous: do it between jobs). Exit 2 = not usable,
# with the reason and the fix; nothing is changed then.
#
# T5_SETUP_ROOT=DIR (tests): write the file under DIR and log the systemctl command to DIR/commands.log.
set -euo pipefail

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: sudo $0 CHECKOUT [UNIT]" >&2; exit 2; }
CHECKOUT=${1%/} UNIT=${2:-t5-rdzv-store.service}
ROOT=${T5_SETUP_ROOT:-}
ENV_FILE=/etc/t5-failover/rdzv-store.env
VENV_PYTHON=.venv/bin/python
bad() { echo "$0: $*" >&2; exit 2; }

[ -n "$ROOT" ] || [ "$(id -u)" = 0 ] || bad "writes $ENV_FILE and restarts $UNIT: run it with sudo"
[[ "$UNIT" =~ ^[A-Za-z0-9_.@-]+\.service$ ]] || bad "UNIT '$UNIT' must be a systemd service name such as t5-rdzv-store.service"
# The path goes into an EnvironmentFile line: absolute, no whitespace, quotes, backslashes or '$'.
[[ "$CHECKOUT" =~ ^/[^[:space:]\"\'\\\$]+$ ]] || bad "CHECKOUT '$CHECKOUT' must be an absolute path without spaces, quotes, backslashes or '\$' (pass \"\$PWD\" in the checkout)"
[ -f "$CHECKOUT/training/rdzv_store.py" ] || bad "$CHECKOUT is not a checkout of this repository (no training/rdzv_store.py)"
py=$CHECKOUT/$VENV_PYTHON
[ -x "$py" ] || bad "no venv at $py: run scripts/venv.sh in $CHECKOUT first"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  bad "$py is $("$py" --version 2>&1), the project needs Python 3.11 or newer: rm -rf $CHECKOUT/.venv and run scripts/venv.sh again"
# The unit runs as an unprivileged dynamic user: a home directory of mode 0700 hides the checkout from it.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null &&
   ! runuser -u nobody -- test -r "$CHECKOUT/training/rdzv_store.py" -a -x "$py" 2>/dev/null; then
  bad "the store runs as an unprivileged user, who cannot read $CHECKOUT: use a checkout under /fsx/users/<you>, or let others read it (chmod o+x on every directory above it)"
fi

install -d -m 0755 "$ROOT$(dirname "$ENV_FILE")"
umask 022
printf '# Written by rdzv_store_checkout.sh: the checkout %s runs the rendezvous store from.\nT5_CHECKOUT=%s\n' \
  "$UNIT" "$CHECKOUT" > "$ROOT$ENV_FILE.tmp"
mv -f "$ROOT$ENV_FILE.tmp" "$ROOT$ENV_FILE"
if [ -n "$ROOT" ]; then echo "systemctl restart $UNIT" >> "$ROOT/commands.log"; else systemctl restart "$UNIT"; fi
echo "[rdzv_store] $UNIT now runs from $CHECKOUT ($ENV_FILE); check: systemctl status ${UNIT%.service}"

#!/usr/bin/env bash
# Create or reuse .venv-pcluster with aws-parallelcluster (requirements-pcluster.txt, fully pinned).
# Separate from .venv because aws-parallelcluster installs CDK v1 into the same aws_cdk package as CDK v2.
# Idempotent: reinstalls only when requirements-pcluster.txt changed. Prints the venv's python path last.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,4p' "$0" | sed 's/^# //'; exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${PCLUSTER_VENV:-$root/.venv-pcluster}"
py=$("$root/scripts/venv.sh" --python) || exit 2  # the project's Python (>= 3.11), chosen as scripts/venv.sh does
req="$root/requirements-pcluster.txt"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
exec 9<"$req"
command -v flock >/dev/null && flock 9  # one creation or installation at a time (e.g. two test workers): a second caller finds it done
if [ ! -x "$venv/bin/python" ]; then
  echo "[pcluster-venv] creating $venv" >&2
  "$py" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[pcluster-venv] installing aws-parallelcluster (pinned; ~1 min)" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
  "$venv/bin/python" -c "import pcluster.schemas.cluster_schema" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# Create or reuse the project venv (.venv) and install the pinned requirements.
# Idempotent: reinstalls only when requirements.txt changed. Prints the venv's python path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${VENV:-$root/.venv}"
py="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  echo "[venv] creating $venv" >&2
  "$py" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[venv] installing pinned requirements (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$root/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

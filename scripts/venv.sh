#!/usr/bin/env bash
# Create or reuse the project venv (.venv) and install the pinned requirements.
# Idempotent: reinstalls only when requirements.txt changed. Prints the venv's python path last.
# torch is installed first, alone, with PyTorch's CPU index added (TORCH_INDEX_URL, default
# https://download.pytorch.org/whl/cpu; empty = only your pip configuration's indexes): the CPU build, never
# PyPI's CUDA build. The other requirements then find it installed and never ask that index.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${VENV:-$root/.venv}"
py="${PYTHON:-python3}"
torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  echo "[venv] creating $venv" >&2
  "$py" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[venv] installing pinned requirements (first run takes a few minutes)" >&2
  pip=("$venv/bin/python" -m pip install -q)
  "${pip[@]}" --upgrade pip >&2
  # One package, one extra index: an unreachable index (an offline mirror) costs one retry, not one per package.
  echo "[venv] torch (CPU build) from ${torch_index:-the configured indexes}${torch_index:+ or the configured indexes}" >&2
  "${pip[@]}" --no-deps --retries 1 ${torch_index:+--extra-index-url "$torch_index"} \
    -r <(grep -E '^torch==' "$root/requirements.txt") >&2
  "${pip[@]}" -r "$root/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

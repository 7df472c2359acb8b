#!/usr/bin/env bash
# Create or reuse the project venv (.venv) and install the pinned requirements.
# Idempotent: reinstalls only when requirements.txt or TORCH_BUILD changed. Prints the venv's python path last.
#
# TORCH_BUILD picks the build of the pinned torch version (unset: the venv's current build, cpu for a new one):
#   cpu    torch is installed first, alone, with PyTorch's CPU index added (TORCH_INDEX_URL, default
#          https://download.pytorch.org/whl/cpu; empty = only your pip configuration's indexes): the CPU build,
#          never PyPI's CUDA build. The other requirements then find it installed and never ask that index.
#          Local runs, CI, and the rendezvous store on a Slurm head node.
#   cu130  (or another of PyTorch's CUDA builds) the same version's CUDA build from
#          https://download.pytorch.org/whl/<build> (TORCH_INDEX_URL overrides), for a venv that GPU nodes run
#          (ParallelCluster without a container image); cluster_assets/docker/align_torch.py installs it, as
#          for the training image. Needs no GPU on the machine that builds the venv.
#
# The interpreter (pyproject.toml: Python >= 3.11): PYTHON if set, else the first of python3.13, python3.12,
# python3.11, python3 on PATH that is 3.11 or newer; none is an error naming the fix (Amazon Linux 2023, the
# ParallelCluster head node's OS, has Python 3.9 as python3: `sudo dnf install -y python3.11`).
# `scripts/venv.sh --python` prints that interpreter and exits (scripts/pcluster_venv.sh uses it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${VENV:-$root/.venv}"

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
pick_python() {  # the interpreter a new venv is made with (see the header)
  if [ -n "${PYTHON:-}" ]; then
    new_enough "$PYTHON" && { echo "$PYTHON"; return; }
    echo "venv.sh: PYTHON=$PYTHON is not a Python 3.11 or newer; point it at one (e.g. PYTHON=python3.11)" >&2
    return 2
  fi
  local c
  for c in python3.13 python3.12 python3.11 python3; do
    command -v "$c" >/dev/null && new_enough "$c" && { echo "$c"; return; }
  done
  echo "venv.sh: no Python 3.11 or newer on PATH (python3 is $(python3 --version 2>&1 || echo missing)); install one" \
       "(Amazon Linux 2023: sudo dnf install -y python3.11; Ubuntu: apt-get install python3.11-venv) or set PYTHON" >&2
  return 2
}
if [ "${1:-}" = --python ]; then pick_python; exit; fi
stamp="$venv/.requirements.sha256"
made=$(cat "$stamp" 2>/dev/null || true)
# Unset TORCH_BUILD keeps the build the venv was made with (make train calls this too: it must not turn a CUDA
# venv back into a CPU one).
[[ "$made" == *+* ]] && made_build=${made#*+} || made_build=cpu
build="${TORCH_BUILD:-$made_build}"
if [[ ! "$build" =~ ^(cpu|cu[0-9]{3}|rocm[0-9]+(\.[0-9]+)*)$ ]]; then
  echo "venv.sh: TORCH_BUILD=$build is not a PyTorch build; use cpu (the default) or a CUDA build such as cu130" >&2
  exit 2
fi
if [ "$build" = cpu ]; then
  torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
else
  torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/$build}"
fi
want=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
[ "$build" = cpu ] || want="$want+$build"  # a CPU venv keeps the stamp it always had
if [ ! -x "$venv/bin/python" ] || [ "$made" != "$want" ]; then
  # One creation or installation at a time (two make commands at once, the test suite's workers): a second caller
  # waits on the lock, then finds the work done.
  exec 9<"$root/requirements.txt"
  command -v flock >/dev/null && flock 9
  made=$(cat "$stamp" 2>/dev/null || true)
fi
if [ ! -x "$venv/bin/python" ]; then
  py=$(pick_python) || exit 2
  echo "[venv] creating $venv with $py" >&2
  "$py" -m venv "$venv"
elif ! new_enough "$venv/bin/python"; then
  echo "venv.sh: $venv was made with $("$venv/bin/python" --version 2>&1); the project needs Python 3.11 or newer:" \
       "remove it (rm -rf $venv) and run scripts/venv.sh again" >&2
  exit 2
fi
if [ "$made" != "$want" ]; then
  echo "[venv] installing pinned requirements (first run takes a few minutes)" >&2
  pip=("$venv/bin/python" -m pip install -q)
  "${pip[@]}" --upgrade pip >&2
  if [ "$build" = cpu ]; then
    # One package, one extra index: an unreachable index (an offline mirror) costs one retry, not one per package.
    echo "[venv] torch (CPU build) from ${torch_index:-the configured indexes}${torch_index:+ or the configured indexes}" >&2
    "${pip[@]}" --no-deps --retries 1 ${torch_index:+--extra-index-url "$torch_index"} \
      -r <(grep -E '^torch==' "$root/requirements.txt") >&2
    "${pip[@]}" -r "$root/requirements.txt" >&2
  else
    "$venv/bin/python" "$root/cluster_assets/docker/align_torch.py" --requirements "$root/requirements.txt" \
      --build "$build" --index-url "$torch_index" >&2
    # The rest of the pins, keeping that torch (the file pins the CPU wheel).
    "${pip[@]}" -r <(grep -vE '^torch==' "$root/requirements.txt") \
      -c <("$venv/bin/python" -c 'import torch; print(f"torch=={torch.__version__}")') >&2
  fi
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# make lint: ruff check (rules in pyproject.toml, [tool.ruff]) and ruff format --check over the Python tree,
# then shellcheck over scripts/. `ruff format .` fixes what the format check finds.
# CI runs it before the tests (.ci/run). Extra arguments go to ruff check, e.g. make lint ARGS="--fix".
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
bin=$(dirname "$py")
rc=0
"$bin/ruff" check --quiet "$@" . || rc=1
"$bin/ruff" format --check --quiet . || { echo "[lint] run: .venv/bin/ruff format ." >&2; rc=1; }
"$bin/shellcheck" scripts/*.sh || rc=1
[ "$rc" -eq 0 ] && echo "[lint] ruff check, ruff format and shellcheck: clean" >&2
exit "$rc"

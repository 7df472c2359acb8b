#!/usr/bin/env bash
# make lint: ruff (rules in pyproject.toml, [tool.ruff]) over the Python tree, shellcheck over scripts/.
# CI runs it before the tests (.ci/run). Extra arguments go to ruff check, e.g. make lint ARGS="--fix".
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
bin=$(dirname "$py")
rc=0
"$bin/ruff" check --quiet "$@" . || rc=1
"$bin/shellcheck" scripts/*.sh || rc=1
[ "$rc" -eq 0 ] && echo "[lint] ruff and shellcheck: clean" >&2
exit "$rc"

#!/usr/bin/env bash
# Run the test suite in the project venv. Extra args go to pytest (e.g. -m "not e2e", -k chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
exec "$py" -m pytest "$@"

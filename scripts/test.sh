#!/usr/bin/env bash
# Run the test suite in the project venv. Extra args go to pytest (e.g. -m "not e2e", -k chaos, -n 0).
# The suite runs on TEST_WORKERS pytest-xdist workers (default 2): most of its time is spent waiting on
# processes it started (training runs detecting a fault, Slurm, etcd), not computing, so two test files at a
# time roughly halve it. A file's tests stay on one worker in order (its module fixtures are built once); files
# that share machine-wide state (the Slurm lab, the synthesized apps) run on one worker (tests/conftest.py).
# TEST_WORKERS=0 runs everything in this process, one test at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
workers="${TEST_WORKERS:-2}"
[[ "$workers" =~ ^[0-9]+$ ]] || { echo "error: TEST_WORKERS=$workers: give a whole number of workers (0 = no workers)" >&2; exit 2; }
exec "$py" -m pytest -n "$workers" --dist loadgroup "$@"

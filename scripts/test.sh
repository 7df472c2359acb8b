#!/usr/bin/env bash
# Run the test suite in the project venv. Extra args go to pytest (e.g. -m "not e2e", -k chaos).
# The suite runs on TEST_WORKERS pytest-xdist workers (default 2), a test file at a time per worker (--dist
# loadfile: a file's tests run in order on one worker, its module fixtures built once): most of the suite's time
# is spent waiting on the processes it starts (training runs detecting a fault, Slurm, etcd), not computing.
# What several files share is made once under a lock (the venvs, node_modules, the Slurm lab's packages).
# TEST_WORKERS=0 runs everything in this process, one test at a time. Every run ends with its 25 slowest tests
# (--durations; ARGS="--durations=N" for another count): where the suite's time goes, on every machine it runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/venv.sh)
workers="${TEST_WORKERS:-2}"
[[ "$workers" =~ ^[0-9]+$ ]] || { echo "error: TEST_WORKERS=$workers: give a whole number of workers (0 = no workers)" >&2; exit 2; }
if [ "$workers" -eq 0 ]; then exec "$py" -m pytest --durations=25 "$@"; fi
exec "$py" -m pytest --durations=25 -n "$workers" --dist loadfile "$@"

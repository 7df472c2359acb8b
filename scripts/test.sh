#!/usr/bin/env bash
# Run the test suite in the project venv: scripts/test.sh [--tier unit|integration|e2e]... [pytest args]
# Extra args go to pytest (e.g. -m "not e2e", -k chaos, a path). The tiers are tests/unit (pure functions, about a
# minute: `make test-unit`), tests/integration (real local processes: etcd, scripts, synth, make; with unit:
# `make test-fast`) and tests/e2e (training runs, chaos, the Slurm lab, the k8s emulator); no --tier runs all three
# (`make test`, what CI runs). The chosen tiers run in ONE pytest run, not one after another: a run per tier would
# pay the workers' start and collection again (~12 s here) and leave a worker idle while the other finishes each
# tier's last file (up to its longest file, e.g. 20 s in unit), more than 30 s on a full run; one line per tier at the
# end says what each passed and the seconds its tests took (tests/conftest.py).
# The suite runs on TEST_WORKERS pytest-xdist workers (default 3), a test file at a time per worker (--dist
# loadfile: a file's tests run in order on one worker, its module fixtures built once): most of the suite's time
# is spent waiting on the processes it starts (training runs detecting a fault, Slurm, etcd), not computing: a clean
# clone on 2 cores used 0.7 of them on average with 2 workers (19.4 CPU-minutes in 28 minutes), hence 3 workers.
# Files are handed out longest first (tests/support/file_order.py, seconds per file in tests/file_seconds.json;
# T5_FILE_SECONDS=tests/file_seconds.json refreshes it from a run), so the long files do not end the run alone.
# What several files share is made once under a lock (the venvs, node_modules, the Slurm lab's packages, the tiny
# reference run the training e2e files compare with: tests/support/session_once.py, once per run, not per worker).
# TEST_WORKERS=0 runs everything in this process, one test at a time. Every run ends with its 25 slowest tests
# (--durations; ARGS="--durations=N" for another count): where the suite's time goes, on every machine it runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
tiers=()
while [ "${1:-}" = "--tier" ]; do
  case "${2:-}" in
    unit|integration|e2e) tiers+=("tests/${2}"); shift 2 ;;
    *) echo "error: --tier ${2:-}: give unit, integration or e2e" >&2; exit 2 ;;
  esac
done
py=$(scripts/venv.sh)
workers="${TEST_WORKERS:-3}"
[[ "$workers" =~ ^[0-9]+$ ]] || { echo "error: TEST_WORKERS=$workers: give a whole number of workers (0 = no workers)" >&2; exit 2; }
if [ "$workers" -eq 0 ]; then exec "$py" -m pytest --durations=25 "${tiers[@]}" "$@"; fi
exec "$py" -m pytest --durations=25 -n "$workers" --dist loadfile "${tiers[@]}" "$@"

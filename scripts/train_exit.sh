#!/usr/bin/env bash
# Used by the Makefile's train and chaos-test recipes when their script fails:
#   scripts/train_exit.sh train|chaos-test RC
# GNU make exits 2 for every failed recipe and keeps the script's own code only in its "make: *** ... Error RC"
# line. This prints one line before that one: the code, what it means for this target and PLATFORM, and how to
# get it as an exit status (call the script directly). Then it exits RC, so make's Error line shows it too.
set -uo pipefail
target=${1:?usage: $0 train|chaos-test RC} rc=${2:?usage: $0 train|chaos-test RC}
platform=${PLATFORM:-local}
case "$target" in
  train) script=scripts/train.sh ;;
  chaos-test) script=scripts/chaos.sh ;;
  *) echo "usage: $0 train|chaos-test RC" >&2; exit 2 ;;
esac

meaning() {  # the code's meaning: README's exit code table (training), the submit scripts' own codes
  if [ "$target" = chaos-test ]; then
    case "$rc" in
      1) echo "a scenario failed its checks (the report says which)" ;;
      2) echo "bad arguments or no usable cluster (the line above names it)" ;;
      130) echo "interrupted (Ctrl-C)" ;;
      *) echo "the chaos test stopped unexpectedly" ;;
    esac
    return
  fi
  case "$platform:$rc" in
    slurm:1|parallelcluster:1) echo "the Slurm job failed or was cancelled" ;;
    slurm:3|parallelcluster:3) echo "no Slurm (sbatch missing) or no shared directory" ;;
    eks:1) echo "the TrainJob failed, or --timeout passed" ;;
    *:2) echo "invalid configuration, data, location or device (fix the named value)" ;;
    # Ctrl-C stops following a cluster's job, not the job; locally it may come before the first checkpoint, so
    # the line above (scripts/train.sh, tools/resume_point) says where a rerun resumes, or that it starts afresh.
    slurm:130|parallelcluster:130|eks:130) echo "stopped following by Ctrl-C; the job keeps running (the line above says how to stop it)" ;;
    *:130) echo "stopped by Ctrl-C (the [train] line above says where a rerun resumes)" ;;
    slurm:*|parallelcluster:*|eks:*) echo "see the submit's line above" ;;
    *:3) echo "checkpoint of another model shape" ;;
    *:4) echo "checkpoint of a run with other settings" ;;
    *:5) echo "diverged (non-finite loss or weights)" ;;
    *:6) echo "checkpoint storage failed (rerun resumes once fixed)" ;;
    *:7) echo "checkpoint.dir in use by another run" ;;
    *:138|*:143) echo "stopped by a signal (the [train] line above says where a rerun resumes)" ;;
    *) echo "the job failed (rerun resumes from the last complete checkpoint)" ;;
  esac
}

echo "[make] $script exited $rc: $(meaning) (README, exit codes); make itself exits 2 for any failed recipe, so run $script directly (same variables and arguments) to get $rc as the exit status" >&2
exit "$rc"

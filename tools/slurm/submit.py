"""Submit the training job to Slurm and follow it: ``make train PLATFORM=slurm`` (scripts/train_slurm.sh).

    python -m tools.slurm.submit [job options] [training flags]
    python -m tools.slurm.submit --nodes 2 --instance-type p5.48xlarge --preset t5-base \\
        --time 12:00:00 --train.steps 20000

Renders the batch script (cluster_assets/slurm/render.py) into ``<shared_dir>/runs/<run>/job.sbatch``, submits
it with sbatch, prints the job id, follows the job log and reports the final state. Exit 0 when the job
completed, 1 when it failed or was cancelled, 2 on a bad setting, 3 when Slurm or the shared directory is
missing. Ctrl-C stops following; the job keeps running.

Job options are the renderer's (below). Training flags are every ``--section.field VALUE``, ``--config FILE``
and anything after ``--``. Environment defaults (flags win): PRESET, NODES, SPARES, NPROC, SHARED_DIR, RUN_NAME,
TIME_LIMIT, PARTITION, INSTANCE_TYPE, CONTAINER_IMAGE, SLURM_JOB_CONFIG (a TOML with a [slurm] table), DRY_RUN
(1/true/yes/on: print the script; tools.env_flags), REQUIRE_ETCD (0/false/no/off: submit a job that has no etcd).
A job without etcd (no --etcd-env, no T5_ETCD_* here) is refused before it is queued (exit 2; a dry run prints the
script and says so): its first node would host the rendezvous store, and losing that node requeues the job.
On the ParallelCluster head node (its etcd.env names T5_ETCD_ADD_JOB) the submit first makes the job's own etcd
user through that root helper and renders the script with the job's job.env (tools.slurm.job_user).
The shared directory defaults to SHARED_DIR, else /fsx when mounted, else the local lab's shared directory.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from cluster_assets.slurm.config import REPO_DIR, SharedDirError, SlurmConfigError, SlurmJobConfig
from cluster_assets.slurm.render import (
    add_job_arguments,
    check_training_args,
    config_from_args,
    flag_of,
    render,
    summary,
)

# (job options, training flags): dotted flags, --config and everything after -- are training's (both submitters)
from cluster_assets.training_args import split_training_flags as split_args
from cluster_facts import FSX_MOUNT_PATH
from cluster_facts.names import ETCD_ENV_FILE
from tools.env_flags import EnvFlagError, env_count, env_flag
from tools.slurm import slurmctl
from tools.slurm.job_user import JobUserError, helper_for, job_key, make_job_user
from tools.slurm.membership import OPT_OUT_VAR, missing_etcd

ENV_FLAGS = {
    "PRESET": "--preset",
    "NODES": "--nodes",
    "SPARES": "--spares",
    "NPROC": "--nproc-per-node",
    "SHARED_DIR": "--shared-dir",
    "RUN_NAME": "--run-name",
    "TIME_LIMIT": "--time",
    "PARTITION": "--partition",
    "INSTANCE_TYPE": "--instance-type",
    "CONTAINER_IMAGE": "--container-image",
    "SLURM_JOB_CONFIG": "--slurm-config",
}
# REQUIRE_ETCD is read apart (env_args): a boolean, its flag is --require-etcd or --no-require-etcd
EXIT_FAILED, EXIT_CONFIG, EXIT_ENVIRONMENT = 1, 2, 3


#: Variables whose flag takes a whole number (the least it may be): checked here, so a bad one is named as the
#: variable (argparse would name the flag it became, with its usage text).
COUNT_VARS = {"NODES": 1, "SPARES": 0, "NPROC": 1}


def env_args(env: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    for var, flag in ENV_FLAGS.items():
        if env.get(var):
            if var in COUNT_VARS:
                env_count(var, None, COUNT_VARS[var], env)  # raises EnvFlagError naming the variable
            out += [flag, env[var]]
    if env.get(OPT_OUT_VAR):  # set and not empty: true keeps the refusal, false submits a job without etcd
        out.append("--require-etcd" if env_flag(OPT_OUT_VAR, env) else "--no-require-etcd")
    if env_flag("DRY_RUN", env):  # raises EnvFlagError on a value that is neither true nor false
        out.append("--dry-run")
    return out


_SETTING = re.compile(r"^(?P<field>[a-z_]+)=(?P<value>.*?): ")


def as_given(message: str, typed: Sequence[str], env: Mapping[str, str]) -> str:
    """A validation message about setting ``field=value`` (SlurmJobConfig's words, which a --slurm-config TOML
    uses) reworded to name what the user gave: the flag typed (``--gpus-per-node -1: ...``) or the variable set
    (``NPROC=0: ...``)."""
    m = _SETTING.match(message)
    flag = flag_of(m.group("field")) if m else None
    if flag is None:
        return message
    rest = message[m.end() :]
    if any(a == flag or a.startswith(flag + "=") for a in typed):
        return f"{flag} {m.group('value')}: {rest}"
    var = next((v for v, f in ENV_FLAGS.items() if f == flag and env.get(v)), None)
    return f"{var}={m.group('value')}: {rest}" if var else message


def build_parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(
        prog="scripts/train_slurm.sh",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="print the batch script, submit nothing")
    p.add_argument("--no-follow", dest="follow", action="store_false", help="submit, print the job id, return")
    p.add_argument(
        "--follow-timeout",
        type=float,
        default=0,
        help="stop following after this many seconds (0 = until the job ends); the job keeps running",
    )
    add_job_arguments(p)
    return p


def default_shared_dir(lab: slurmctl.Lab | None) -> str:
    if Path(FSX_MOUNT_PATH).is_dir():
        return FSX_MOUNT_PATH
    if lab is not None:
        return str(lab.shared_dir)
    raise SharedDirError(
        "no shared directory: pass --shared-dir DIR (or SHARED_DIR=DIR), a file system every "
        "node mounts at the same path (/fsx on ParallelCluster); for the local lab run "
        "`make slurm-up` first"
    )


def follow(job: int, log: Path, env: Mapping[str, str], timeout_s: float = 0, out=sys.stdout) -> int:
    """Print the job log as it grows and state changes until the job ends; return the exit code to use."""
    pos, last, t0 = 0, None, time.monotonic()
    final: slurmctl.JobInfo | None = None
    while True:
        info = slurmctl.job_info(job, env=env)
        if log.is_file():
            with open(log, errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                out.write(chunk)
                out.flush()
        if info is None:
            done = log.is_file() and "DONE:" in log.read_text(errors="replace")[-4000:]
            print(
                f"[train-slurm] job {job}: record purged by slurmctld; the log says "
                f"{'it finished' if done else 'it did not finish'} ({log})",
                file=out,
                flush=True,
            )
            return 0 if done else EXIT_FAILED
        key = (info.state, info.restarts, info.reason if info.state == "PENDING" else "")
        if key != last:
            extra = f" ({info.reason})" if info.state == "PENDING" and info.reason not in ("", "None") else ""
            where = f" on {info.node_list}" if info.state == "RUNNING" else ""
            again = f", requeued {info.restarts}x" if info.restarts else ""
            print(f"[train-slurm] job {job}: {info.state}{extra}{where}{again}", file=out, flush=True)
            last = key
        if info.terminal:
            final = info
            break
        if timeout_s and time.monotonic() - t0 > timeout_s:
            print(
                f"[train-slurm] stopped following after {timeout_s:.0f} s; job {job} keeps running "
                f"(squeue -j {job}; log {log})",
                file=out,
                flush=True,
            )
            return EXIT_FAILED
        time.sleep(2)
    time.sleep(0.5)  # the last lines may land right after the state change
    if log.is_file():
        with open(log, errors="replace") as f:
            f.seek(pos)
            out.write(f.read())
    ok = final.succeeded
    print(
        f"[train-slurm] job {job} {'COMPLETED' if ok else 'FAILED: ' + final.state} (exit code {final.exit_code}, "
        f"requeued {final.restarts}x); log {log}",
        file=out,
        flush=True,
    )
    return 0 if ok else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train = split_args(argv)
    parser = build_parser()
    try:
        from_env = env_args(os.environ)
    except EnvFlagError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    a = parser.parse_args(from_env + ours + (["--", *train] if train else []))
    try:
        env, lab = slurmctl.resolve_environment()
        if a.shared_dir is None:
            a.shared_dir = default_shared_dir(lab)
        cfg: SlurmJobConfig = config_from_args(a)
        if not cfg.python and cfg.repo_dir == str(REPO_DIR) and sys.prefix != sys.base_prefix:
            cfg = replace(cfg, python=sys.executable)  # the venv scripts/venv.sh made (VENV may move it)
        if cfg.slurm_conf is None and env.get("SLURM_CONF"):
            cfg = replace(cfg, slurm_conf=env["SLURM_CONF"])
        if lab is not None and cfg.etcd_env is None and not os.environ.get("T5_ETCD_ENDPOINTS") and lab.etcd_env:
            cfg = replace(cfg, etcd_env=lab.etcd_env)  # the lab's etcd members (the clusters' layout)
        elif lab is not None and a.rdzv_store_port is None and lab.store_port:
            cfg = replace(cfg, rdzv_store_port=lab.store_port)  # a lab that still runs a c10d store
        cfg = cfg.with_instance_type().validate(check_paths=True)
        check_training_args(cfg)
        text = render(cfg)
    except SlurmConfigError as e:
        print(f"error: {as_given(str(e), ours, os.environ)}", file=sys.stderr)
        return EXIT_ENVIRONMENT if isinstance(e, SharedDirError) else EXIT_CONFIG
    no_etcd = missing_etcd(
        etcd_env=cfg.etcd_env,
        require_etcd=cfg.require_etcd,
        env=env,
        stack_file_here=Path(ETCD_ENV_FILE).is_file(),
    )
    if a.dry_run:
        sys.stdout.write(text)
        if no_etcd:
            print(f"warning: a submit would be refused: {no_etcd}", file=sys.stderr)
        return 0
    try:
        slurmctl.require("sbatch")
    except slurmctl.SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    if no_etcd:  # after the Slurm check: on a machine without Slurm that is the first thing to fix
        print(f"error: {no_etcd}", file=sys.stderr)
        return EXIT_CONFIG
    helper = helper_for(cfg.etcd_env, env)
    if helper:  # ParallelCluster: the head node's helper makes the job's etcd user; root's password stays root's
        try:
            cfg = replace(cfg, etcd_env=make_job_user(helper, job_key(cfg.name)))
            text = render(cfg)
        except (JobUserError, SlurmConfigError) as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_ENVIRONMENT
        print(f"[train-slurm] this job's etcd user: {cfg.etcd_env}", flush=True)
    run_dir = Path(cfg.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the --output directory
        script = run_dir / "job.sbatch"
        script.write_text(text)
    except OSError as e:
        print(f"error: cannot write {run_dir} ({e}): the shared directory must be writable", file=sys.stderr)
        return EXIT_ENVIRONMENT
    if lab is not None:
        print(f"[train-slurm] using the local Slurm lab ({lab.root}); SLURM_CONF={env['SLURM_CONF']}", flush=True)
    try:
        job = slurmctl.sbatch(script, env=env)
    except slurmctl.SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    log = Path(cfg.log_pattern.replace("%j", str(job)))
    print(f"[train-slurm] submitted job {job}: {summary(cfg)}", flush=True)
    print(
        f"[train-slurm] log {log}; cancel with: scancel {job}; checkpoint + requeue now with: "
        f"scancel --batch --signal=USR1 {job}",
        flush=True,
    )
    if not a.follow:
        return 0
    try:
        return follow(job, log, env, a.follow_timeout)
    except KeyboardInterrupt:
        print(f"\n[train-slurm] stopped following; job {job} keeps running (scancel {job} to stop it)")
        return 130
    except slurmctl.SlurmError as e:
        print(f"error while following job {job}: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

"""Render the Slurm batch script of a training job from a :class:`SlurmJobConfig`.

    python -m cluster_assets.slurm.render --shared-dir /fsx --nodes 2 --instance-type p5.48xlarge \\
        --preset t5-base --time 12:00:00 --run-name base-1 --output job.sbatch -- --train.steps 20000
    sbatch job.sbatch

Values come from the defaults, then ``--slurm-config FILE.toml`` (a ``[slurm]`` table with the field names below),
then the flags. Everything after ``--`` goes to ``python -m training``. Exit 2 on a bad setting.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

from cluster_assets.slurm.config import SLURM_TIMEOUTS, SlurmConfigError, SlurmJobConfig, field_docs
from cluster_assets.training_args import TrainingArgsError
from cluster_assets.training_args import check_training_args as shared_check
from cluster_facts import EFA_LIBRARY_DIRS, nccl_env

TEMPLATE = Path(__file__).with_name("job.sbatch.in")


def _q(value: str | None) -> str:
    return shlex.quote(value or "")


def efa_env(cfg: SlurmJobConfig) -> dict[str, str]:
    """NCCL/EFA environment of the job's nodes: the one the EKS runtime uses too
    (:func:`cluster_facts.nccl_env`); empty on CPU nodes (no NCCL there)."""
    if not cfg.gpus_per_node:
        return {}
    return nccl_env(efa=cfg.efa, gpudirect_rdma=cfg.gpudirect_rdma)


def sbatch_lines(cfg: SlurmJobConfig) -> list[str]:
    """The ``#SBATCH`` options beyond the fixed ones in the template."""
    lines = ["--requeue" if cfg.requeue else "--no-requeue", f"--signal=B:USR1@{cfg.signal_before_timeout_s}"]
    if cfg.time_limit:
        lines.append(f"--time={cfg.time_limit}")
    if cfg.partition:
        lines.append(f"--partition={cfg.partition}")
    if cfg.gpus_per_node:
        lines.append(f"--gpus-per-node={cfg.gpus_per_node}")
    if cfg.spares:
        # A lost node no longer ends the allocation: the spare takes its place inside it (the batch host's loss
        # still does, and Slurm then requeues). Without a spare the job could not continue anyway, and Slurm's
        # NODE_FAIL requeue is the fastest way back.
        lines.append("--no-kill")
    lines += list(cfg.extra_sbatch)
    return [f"#SBATCH {x}" for x in lines]


def summary(cfg: SlurmJobConfig) -> str:
    """One comment line saying what the script runs (shown at the top of the rendered file)."""
    hw = (f"{cfg.gpus_per_node} GPU(s)/node" + (" + EFA" if cfg.efa else "")) if cfg.gpus_per_node else "CPU"
    where = (
        f"container {cfg.container_image} via pyxis (else venv)" if cfg.container_image else f"venv {cfg.venv_python}"
    )
    spares = f" + {cfg.spares} hot spare(s)" if cfg.spares else ""
    return (
        f"run {cfg.name}: preset {cfg.preset}, {cfg.nodes} node(s){spares} x {cfg.procs_per_node} proc(s), {hw}; "
        f"{where}; checkpoints {cfg.checkpoint_dir}"
    )


def render(cfg: SlurmJobConfig) -> str:
    """The batch script text for ``cfg`` (validated; GPU facts filled from ``instance_type``)."""
    cfg = cfg.with_instance_type().validate()
    env = {**efa_env(cfg), **dict(kv.split("=", 1) for kv in cfg.extra_env)}
    env_lines = [f"export {k}={_q(v)}" for k, v in env.items()]
    if cfg.efa:
        # Slurm only: in venv mode the job runs on the ParallelCluster AMI, whose EFA installer may put libfabric
        # and aws-ofi-nccl outside the default library path (an EKS pod runs the image, which sets its own).
        env_lines.append(
            f"for d in {' '.join(EFA_LIBRARY_DIRS)}; do "
            '[[ -d "$d" ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done'
        )
    if not env_lines:
        env_lines = ["# (CPU job: no NCCL/EFA settings)"]
    values = {
        "SUMMARY": summary(cfg),
        "JOB_NAME": cfg.name,
        "NODES": str(cfg.nodes),
        "SPARES": str(cfg.spares),
        "ALLOC_NODES": str(cfg.nodes + cfg.spares),
        "LOG": cfg.log_pattern,
        "RUN_DIR": cfg.run_dir,
        "SBATCH_LINES": "\n".join(sbatch_lines(cfg)),
        "Q_RUN_DIR": _q(cfg.run_dir),
        "Q_CKPT_DIR": _q(cfg.checkpoint_dir),
        "Q_METRICS": _q(cfg.metrics_path),
        "Q_REPO_DIR": _q(cfg.repo_dir),
        "Q_PYTHON": _q(cfg.venv_python),
        "Q_CONTAINER_IMAGE": _q(cfg.container_image),
        "Q_CONTAINER_MOUNTS": _q(",".join(cfg.mounts)),
        "NPROC": str(cfg.procs_per_node),
        "MAX_RESTARTS": str(cfg.max_restarts),
        "SHUTDOWN_TIMEOUT": str(cfg.shutdown_timeout_s),
        "TRAIN_TIMEOUT": str(SLURM_TIMEOUTS.train_pg_timeout_s),
        "JOIN_TIMEOUT": str(SLURM_TIMEOUTS.rdzv_join_timeout_s),
        "RDZV_PORT": str(cfg.rdzv_port),
        "Q_RDZV_STORE": _q(cfg.rdzv_store),
        "Q_ETCD_ENV": _q(cfg.etcd_env),
        "RDZV_STORE_PORT": str(cfg.rdzv_store_port),
        "STEP_TIMEOUT": str(cfg.srun_timeout_s),
        "REQUEUE": "1" if cfg.requeue else "0",
        "REQUEUE_ON_FAILURE": "1" if cfg.requeue_on_failure else "0",
        "MAX_REQUEUES": str(cfg.max_requeues),
        "Q_PRESET": _q(cfg.preset),
        "TRAIN_ARGS": " ".join(_q(a) for a in cfg.train_args),
        "SLURM_CONF_LINE": f"export SLURM_CONF={_q(cfg.slurm_conf)}"
        if cfg.slurm_conf
        else "# SLURM_CONF: the cluster's default",
        "ENV_LINES": "\n".join(env_lines),
    }
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    if "@@" in text:  # a template placeholder without a value is a bug here, not a user error
        raise RuntimeError(f"unrendered placeholder in {TEMPLATE}: {text[text.index('@@') :][:40]}")
    return text


def check_training_args(cfg: SlurmJobConfig, *, files_here: bool = True) -> None:
    """Validate preset + training flags before queueing, with the check the EKS submit uses too
    (cluster_assets/training_args.py): the training package's parser and validation, and the world size
    (nodes x processes per node) against the global batch.

    Catches typos and bad values on the login node instead of minutes later on the cluster. With
    ``files_here`` (this host mounts shared_dir, and training runs in the venv, not a container with its own
    view of the files), the data and output locations are checked here too.
    """
    argv = [
        "--job.out_dir",
        cfg.run_dir,
        "--checkpoint.dir",
        cfg.checkpoint_dir,
        "--metrics.path",
        cfg.metrics_path,
        *cfg.train_args,
    ]
    try:
        venv = files_here and cfg.container_image is None
        shared_check(
            cfg.preset,
            argv,
            nodes=cfg.nodes,
            nproc_per_node=cfg.procs_per_node,
            files_here=venv,
            python=cfg.venv_python if venv else None,
            gpus_per_node=cfg.gpus_per_node,
        )
    except TrainingArgsError as e:
        raise SlurmConfigError(str(e)) from None


# ---------------------------------------------------------------------------------------------- CLI
_FLAGS = {  # field -> (flag, argparse kwargs)
    "run_name": ("--run-name", {}),
    "preset": ("--preset", {}),
    "nodes": ("--nodes", {"type": int}),
    "spares": ("--spares", {"type": int}),
    "nproc_per_node": ("--nproc-per-node", {"type": int}),
    "instance_type": ("--instance-type", {}),
    "gpus_per_node": ("--gpus-per-node", {"type": int}),
    "partition": ("--partition", {}),
    "time_limit": ("--time", {}),
    "signal_before_timeout_s": ("--signal-before-timeout", {"type": int}),
    "max_requeues": ("--max-requeues", {"type": int}),
    "max_restarts": ("--max-restarts", {"type": int}),
    "shutdown_timeout_s": ("--shutdown-timeout", {"type": int}),
    "rdzv_port": ("--rdzv-port", {"type": int}),
    "rdzv_store": ("--rdzv-store", {}),
    "etcd_env": ("--etcd-env", {}),
    "rdzv_store_port": ("--rdzv-store-port", {"type": int}),
    "shared_dir": ("--shared-dir", {}),
    "repo_dir": ("--repo-dir", {}),
    "python": ("--python", {}),
    "container_image": ("--container-image", {}),
    "step_timeout_s": ("--step-timeout", {"type": int}),
    "slurm_conf": ("--slurm-conf", {}),
}
_BOOLS = {
    "requeue": "--requeue",
    "requeue_on_failure": "--requeue-on-failure",
    "efa": "--efa",
    "gpudirect_rdma": "--gpudirect-rdma",
    "require_etcd": "--require-etcd",
}
_LISTS = {"container_mounts": "--container-mount", "extra_sbatch": "--sbatch", "extra_env": "--env"}


def flag_of(field_name: str) -> str | None:
    """The command-line flag of a SlurmJobConfig field (``gpus_per_node`` -> ``--gpus-per-node``), if it has one."""
    if field_name in _FLAGS:
        return _FLAGS[field_name][0]
    return _BOOLS.get(field_name) or _LISTS.get(field_name)


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The SlurmJobConfig flags (shared by the renderer and the submitter) and the training-args remainder."""
    docs = field_docs()
    defaults = SlurmJobConfig()
    p.add_argument("--slurm-config", help="TOML file with a [slurm] table of the settings below")
    for name, (flag, kw) in _FLAGS.items():
        p.add_argument(
            flag,
            dest=name,
            default=None,
            help=f"{docs.get(name, '')} (default: {getattr(defaults, name)!r})".replace("%", "%%"),
            **kw,
        )
    for name, flag in _BOOLS.items():
        p.add_argument(
            flag,
            dest=name,
            default=None,
            action=argparse.BooleanOptionalAction,
            help=f"{docs.get(name, '')} (default: {getattr(defaults, name)})".replace("%", "%%"),
        )
    for name, flag in _LISTS.items():
        p.add_argument(
            flag, dest=name, action="append", default=None, help=f"(repeatable) {docs.get(name, '')}".replace("%", "%%")
        )
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then python -m training flags")


def build_parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(
        prog="python -m cluster_assets.slurm.render",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--output", "-o", help="write the script here (default: stdout)")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings as JSON and exit")
    p.add_argument(
        "--no-check-training-args",
        dest="check_training",
        action="store_false",
        help="skip validating the training flags with python -m training's parser",
    )
    p.add_argument(
        "--check-paths",
        action="store_true",
        help="also check that shared_dir exists here and the preset is in repo_dir",
    )
    add_job_arguments(p)
    return p


def config_from_args(a: argparse.Namespace) -> SlurmJobConfig:
    cfg = SlurmJobConfig.from_toml(a.slurm_config) if a.slurm_config else SlurmJobConfig()
    over = {}
    for name in (*_FLAGS, *_BOOLS):
        if getattr(a, name) is not None:
            over[name] = getattr(a, name)
    for name in _LISTS:
        if getattr(a, name):
            over[name] = tuple(getattr(a, name))
    targs = list(a.train_args)
    if targs and targs[0] == "--":
        targs = targs[1:]
    if targs:
        over["train_args"] = tuple(targs)
    return replace(cfg, **over)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; training flags go after '--'")
    try:
        cfg = config_from_args(a).with_instance_type().validate(check_paths=a.check_paths)
        if a.check_training:
            check_training_args(cfg, files_here=a.check_paths)
        if a.print_config:
            print(
                json.dumps(
                    {
                        **asdict(cfg),
                        "run_dir": cfg.run_dir,
                        "checkpoint_dir": cfg.checkpoint_dir,
                        "metrics_path": cfg.metrics_path,
                    },
                    indent=1,
                )
            )
            return 0
        text = render(cfg)
    except SlurmConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.output:
        Path(a.output).write_text(text)
        Path(a.output).chmod(0o755)
        print(f"wrote {a.output}: {summary(cfg)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["render", "efa_env", "sbatch_lines", "check_training_args", "main"]

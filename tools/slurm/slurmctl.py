"""Small, typed wrappers around the Slurm client commands (sbatch, scontrol, sinfo, scancel).

Every call has a timeout (a wedged slurmctld must not hang the caller) and raises :class:`SlurmError` with
the command and its stderr. Also finds the project's local Slurm lab, so that ``make train PLATFORM=slurm``
after ``make slurm-up`` needs no manual ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from cluster_assets.slurm.config import REPO_DIR

DEFAULT_LAB_ROOT = REPO_DIR / ".slurm-lab"
# Job states after which the job will not run again (a requeued job passes through PENDING/REQUEUED instead).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
_TOKEN = re.compile(r"(\S+?)=(\S*)")


class SlurmError(RuntimeError):
    """A Slurm command failed or is missing; the message says which and what to do."""


def require(cmd: str = "sbatch") -> str:
    path = shutil.which(cmd)
    if not path:
        raise SlurmError(
            f"{cmd} not found: run this on a Slurm head/login node (ParallelCluster: open a shell on "
            f"the head node with the stack output HeadNodeSessionCommand, `aws ssm start-session "
            f"--target <HeadNodeInstanceId>`), or start the local test cluster with `make slurm-up`"
        )
    return path


def run(args: list[str], *, env: Mapping[str, str] | None = None, timeout: float = 60) -> str:
    """Run a Slurm client command; return stdout. Raises SlurmError on failure or timeout."""
    require(args[0])
    try:
        out = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, env=dict(env) if env is not None else None
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`{' '.join(args)}` did not answer within {timeout:.0f} s (is slurmctld up? `scontrol ping`)"
        ) from None
    if out.returncode != 0:
        raise SlurmError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def sbatch(script: str | Path, *, env: Mapping[str, str] | None = None, extra: list[str] | None = None) -> int:
    """Submit a batch script; returns the job id."""
    out = run(["sbatch", "--parsable", *(extra or []), str(script)], env=env)
    try:
        return int(out.strip().split(";")[0])
    except ValueError:
        raise SlurmError(f"sbatch printed {out.strip()!r}, not a job id") from None


@dataclass(frozen=True)
class JobInfo:
    """The fields of ``scontrol show job -o`` that callers use, plus all raw fields."""

    job_id: int
    state: str
    reason: str
    restarts: int
    exit_code: str
    node_list: str
    batch_host: str
    fields: dict[str, str]

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == "0:0"


def parse_job(line: str) -> JobInfo:
    f = dict(_TOKEN.findall(line))
    return JobInfo(
        job_id=int(f.get("JobId", "0")),
        state=f.get("JobState", "UNKNOWN"),
        reason=f.get("Reason", ""),
        restarts=int(f.get("Restarts", "0") or 0),
        exit_code=f.get("ExitCode", ""),
        node_list=f.get("NodeList", ""),
        batch_host=f.get("BatchHost", ""),
        fields=f,
    )


def job_info(job_id: int, *, env: Mapping[str, str] | None = None) -> JobInfo | None:
    """Current job record, or None once slurmctld has purged it (MinJobAge after the end)."""
    try:
        out = run(["scontrol", "show", "job", "-o", str(job_id)], env=env, timeout=30)
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    line = out.strip().splitlines()[0] if out.strip() else ""
    return parse_job(line) if line else None


def node_states(*, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Node name -> full state (e.g. IDLE, MIXED, DOWN+NOT_RESPONDING, IDLE+DRAIN)."""
    out = run(["scontrol", "show", "node", "-o"], env=env, timeout=30)
    states = {}
    for line in out.splitlines():
        f = dict(_TOKEN.findall(line))
        if "NodeName" in f:
            states[f["NodeName"]] = f.get("State", "UNKNOWN")
    return states


def scancel(
    job_id: int, *, signal: str | None = None, batch: bool = False, env: Mapping[str, str] | None = None
) -> None:
    args = ["scancel"]
    if signal:
        args.append(f"--signal={signal}")
    if batch:
        args.append("--batch")
    run([*args, str(job_id)], env=env, timeout=30)


# ------------------------------------------------------------------------------------------ the local lab
@dataclass(frozen=True)
class Lab:
    """A running local Slurm lab (testbed/slurm_lab): its root, slurm.conf and shared directory."""

    root: Path

    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def shared_dir(self) -> Path:
        return self.root / "shared"

    @property
    def up(self) -> bool:
        return (self.root / "env.sh").is_file() and self.slurm_conf.is_file()

    def setting(self, name: str) -> str | None:
        """A setting of the running lab (``NAME=value`` in lab.env, written by up.sh), or None."""
        try:
            text = (self.root / "lab.env").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f"{name}="):
                return line.split("=", 1)[1].strip()
        return None

    @property
    def store_port(self) -> int | None:
        """Port of the rendezvous store the lab runs on its controller (``SLAB_STORE_PORT`` in lab.env)."""
        port = self.setting("SLAB_STORE_PORT")
        return int(port) if port and port.isdigit() else None

    @property
    def etcd_env(self) -> str | None:
        """The lab's etcd administration file (root's ``T5_ETCD_*``, ``<root>/etcd/admin.env``), if it runs etcd:
        the batch script makes each job's etcd user with it."""
        path = self.root / "etcd" / "admin.env"
        return str(path) if path.is_file() else None


def lab_for_conf(conf: str | None) -> Lab | None:
    """The lab a SLURM_CONF path belongs to (``<root>/etc/slurm.conf`` next to ``<root>/lab.env``)."""
    if not conf:
        return None
    root = Path(conf).resolve().parent.parent
    return Lab(root) if (root / "lab.env").is_file() else None


def resolve_environment(env: Mapping[str, str] | None = None) -> tuple[dict[str, str], Lab | None]:
    """Environment for Slurm commands, and the lab in use (if any).

    SLURM_CONF set: used as is. Unset, no /etc/slurm/slurm.conf, but the project's lab is up: the lab's.
    """
    out = dict(os.environ if env is None else env)
    conf = out.get("SLURM_CONF")
    if not conf and not Path("/etc/slurm/slurm.conf").is_file() and not Path("/etc/slurm-llnl/slurm.conf").is_file():
        lab = Lab(Path(out.get("SLAB_ROOT") or DEFAULT_LAB_ROOT))
        if lab.up:
            out["SLURM_CONF"] = str(lab.slurm_conf)
            return out, lab
    return out, lab_for_conf(out.get("SLURM_CONF"))

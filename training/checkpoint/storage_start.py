"""The storage tier's checks before training: checkpoint.dir is writable with room, holds no stranger where this run
will save, and has a lineage id. Rank 0 looks; every rank gets its finding. A problem is a location to fix, like
the start checks' (ConfigError, exit 2)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil

from training.checkpoint.integrity import storage_reason
from training.checkpoint.layout import LINEAGE, PREFIX, PROBE, foreign_entries, is_ours, parse_step, step_dir
from training.checkpoint.storage_site import StorageSite
from training.config import ConfigError

log = logging.getLogger("training.checkpoint")


def check_storage(site: StorageSite, checkpoint_bytes: int) -> None:
    """Before training: the directory is writable and has room for one more checkpoint (rank 0 checks)."""
    root = site.root
    problem = None
    if site.rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f"{PROBE}-{os.getpid()}"
            with open(probe, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
            free = shutil.disk_usage(root).free
            if free < checkpoint_bytes:
                problem = (
                    f"checkpoint.dir {root} has {free / 1e6:,.0f} MB free, but one checkpoint of "
                    f"this run needs about {checkpoint_bytes / 1e6:,.0f} MB: free space there or point "
                    "--checkpoint.dir at a larger file system"
                )
        except OSError as e:
            problem = (
                f"checkpoint.dir {root} is not writable: {storage_reason(e)}; point "
                "--checkpoint.dir at a writable directory"
            )
        foreign = foreign_entries(root) if problem is None else []
        if foreign:
            shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
            log.warning(
                "WARNING: checkpoint.dir %s also holds entries this job did not write (%s); they are "
                "never loaded, pruned or overwritten. A directory of its own per run is safer.",
                root,
                shown,
            )
    problem = site.agree(problem)
    if problem:  # found before training: a location to fix, like the start checks' (exit 2)
        raise ConfigError(problem)


def lineage(site: StorageSite) -> str:
    """Collective: the id of the run this directory holds, made by its first start (rank 0) and read by every
    later one. In-memory snapshots carry it: a directory emptied for a fresh start never gets an old one."""
    token = None
    if site.rank == 0:
        path = site.root / LINEAGE
        try:
            token = path.read_text().strip()
        except OSError:
            token = ""
        if not token:
            token = secrets.token_hex(8)
            tmp = path.with_name(f"{LINEAGE}.tmp{os.getpid()}")
            tmp.write_text(token)
            os.replace(tmp, path)
    return site.agree(token)


def check_no_clash(site: StorageSite, first_step: int, last_step: int) -> None:
    """Refuse to start if a foreign directory sits where this run will save (it would be overwritten)."""
    root = site.root
    problem = None
    if site.rank == 0:
        clash = [
            p.name
            for p in sorted(root.glob(f"{PREFIX}*"))
            if p.is_dir()
            and (s := parse_step(p)) is not None
            and first_step <= s <= last_step
            and p.name == step_dir(root, s).name
            and not is_ours(p)
        ]
        if clash:
            problem = (
                f"checkpoint.dir {root} holds {', '.join(clash[:5])}, which this job did not write "
                "but would save into; move them, or point --checkpoint.dir at a directory of its own "
                "(nothing was changed)"
            )
    problem = site.agree(problem)
    if problem:
        raise ConfigError(problem)

"""The first host of a Slurm hostlist (``SLURM_JOB_NODELIST``): where a plain-c10d job's store lives."""

from __future__ import annotations

import shutil
import subprocess
import sys

from training.launch.config import LaunchError


def expand_first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression without Slurm (``node[03-05,9],gpu1`` -> ``node03``).

    Fallback when ``scontrol`` is not installed; handles the common prefix[ranges] forms.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise LaunchError("SLURM_JOB_NODELIST is empty")
    depth = 0
    for i, c in enumerate(nodelist):  # the first top-level comma ends the first entry
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            nodelist = nodelist[:i]
            break
    if "[" not in nodelist:
        return nodelist
    prefix, rest = nodelist.split("[", 1)
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    return prefix + first + (rest.split("]", 1)[1] if "]" in rest else "")


def slurm_first_host(nodelist: str, scontrol: str | None = None) -> str:
    """First host of SLURM_JOB_NODELIST via ``scontrol show hostnames`` (Slurm's own expansion)."""
    scontrol = scontrol or shutil.which("scontrol")
    if not scontrol:
        return expand_first_host(nodelist)
    out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    hosts = out.stdout.split()
    if out.returncode != 0 or not hosts:
        # e.g. no slurm.conf reachable from this shell; the hostlist grammar is simple enough to expand here
        last = (out.stderr.strip().splitlines() or ["no hosts"])[-1]
        print(
            f"[launch] warning: scontrol show hostnames {nodelist!r} failed ({last}); expanding it without Slurm",
            file=sys.stderr,
        )
        return expand_first_host(nodelist)
    return hosts[0]

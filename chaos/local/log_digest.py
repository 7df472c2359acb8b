"""What the nodes of a local chaos scenario said about its failures and recoveries, in time order: the lines a
failed scenario's message carries, so that a run on a machine whose files are gone (CI) still says why the job
took the path it took (the rendezvous's rounds, the in-place recoveries and their fall-backs, the agents' worker
failures, errors). Reads ``<workdir>/logs/*.log`` (``<time> <line>``, :class:`.cluster.LogTap`) as the goodput
ledger reads an agent log (:func:`training.goodput.ledger.read_agent_log`)."""

from __future__ import annotations

from pathlib import Path

from training.goodput.ledger import read_agent_log

#: The marks of a line worth carrying: the rendezvous, the in-place recovery, the agents, and what went wrong.
MARKS = (
    "[rendezvous]",
    "[inplace]",
    "[agent]",
    "in-place recovery",
    "falling back",
    "failed (exitcode",
    "Error",
    "restored step",
    "fresh start",
    "in-memory snapshot",
    "[fault]",
    "[watchdog]",
)


def digest(workdir: str | Path, *, limit: int = 40, width: int = 220) -> str:
    """The newest ``limit`` marked lines of every node's log, merged by time, each ``<node> +<s> <line>`` cut to
    ``width`` characters (seconds from the first line kept); "" when there are no logs."""
    picked = [
        (t, log.stem, line.strip())
        for log in sorted(Path(workdir, "logs").glob("*.log"))
        for t, line in read_agent_log(log)
        if any(m in line for m in MARKS)
    ]
    if not picked:
        return ""
    picked.sort(key=lambda p: p[0])
    t0 = picked[0][0]
    return "\n".join(f"{node} +{t - t0:.1f}s {line}"[:width] for t, node, line in picked[-limit:])

"""``python -m training.goodput RUN_DIR``: the goodput ledger of a run (see :mod:`training.goodput.ledger`).

Prints each failure with its phases, the run's goodput and the uninterrupted estimate, then writes the timeline
PNG (``RUN_DIR/goodput.png``). ``--json`` prints the same figures as JSON for scripts; ``--summary`` one line
(``make train`` prints it at the end). A directory that is not a run's: one line and exit 2. Lines of the metrics
that are not records (a damaged file) are left out, with one warning line on stderr; so is a timeline that
cannot be written (a read-only run directory: ``--png PATH`` or ``--no-png``), and the exit stays 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.goodput.ledger import (
    PNG,
    Ledger,
    LedgerError,
    ledger_text,
    locate_run,
    read_ledger,
    skipped_warning,
    summary_line,
    timeline_track,
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(
        prog="python -m training.goodput",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [options] (RUN_DIR | -- TRAINING_ARGS)",
        epilog="-- TRAINING_ARGS: instead of RUN_DIR, the run's training arguments (e.g. -- "
        "--preset debug), resolved as the job resolves them (job.out_dir, metrics.path)",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help="the run's job.out_dir (metrics.jsonl, config.toml), e.g. runs/debug for make train",
    )
    p.add_argument("--json", action="store_true", help="print the ledger as JSON (figures in seconds)")
    p.add_argument("--summary", action="store_true", help="print only the one-line summary")
    p.add_argument("--png", metavar="PATH", help=f"where to write the timeline (default RUN_DIR/{PNG})")
    p.add_argument("--no-png", action="store_true", help="do not draw the timeline")
    p.add_argument(
        "--agent-log",
        metavar="FILE",
        action="append",
        default=[],
        help="a timestamped agent log ('<epoch seconds> <line>' lines, as the chaos harness writes "
        "them) for the detect times; RUN_DIR/agent.log is read when it exists",
    )
    a = p.parse_args(argv)
    try:
        run_dir, metrics = locate_run(a.run_dir, train_args)
        ledger = read_ledger(run_dir, [Path(x) for x in a.agent_log], metrics=metrics)
    except LedgerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    png = None if a.no_png or a.summary else Path(a.png) if a.png else Path(run_dir) / PNG
    if a.json:  # the JSON names the picture only once it was written
        print(
            json.dumps({**ledger.to_json(), "timeline_png": str(png) if png and draw(png, ledger) else None}, indent=1)
        )
    elif a.summary:
        print(summary_line(ledger))
    else:
        print(ledger_text(ledger), flush=True)  # the figures first: the picture is extra and may fail
        if png and draw(png, ledger):
            print(f"timeline: {png}")
    if warning := skipped_warning(ledger):  # after the figures, where it is read
        print(warning, file=sys.stderr)
    return 0


def draw(png: Path, ledger: Ledger) -> bool:
    """Write the timeline PNG; False, with one warning line, where it cannot be: a read-only run directory, a path
    under a file, a full disk, a suffix matplotlib has no format for; or records it cannot plot."""
    from training.goodput.timeline import timeline_png

    try:
        timeline_png(png, [timeline_track(ledger)], "goodput ledger")
        return True
    except (OSError, ValueError) as e:  # ValueError: matplotlib's for a suffix (the part before its format list)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split(" (")[0][:100]
        print(
            f"warning: the timeline cannot be written to {png} ({why}): give --png PATH (a writable .png file), "
            f"or --no-png",
            file=sys.stderr,
        )
    except Exception as e:  # noqa: BLE001 - the picture is extra: records it cannot plot must not hide the ledger
        print(
            f"warning: the timeline cannot be drawn ({type(e).__name__}: {' '.join(str(e).split())[:80]}): the "
            f"records hold values it cannot plot; --no-png leaves it out",
            file=sys.stderr,
        )
    return False


if __name__ == "__main__":
    sys.exit(main())

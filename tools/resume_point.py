"""What a rerun of a stopped job starts from, in one line: ``make train`` prints it after a Ctrl-C or SIGTERM.

    python -m tools.resume_point [training arguments]    # e.g. --preset debug --job.out_dir runs/x

It resolves ``checkpoint.dir`` from the same arguments the job got and names its newest complete checkpoint, or
says there is none yet (a stop before the first checkpoint: the rerun starts from the beginning). Torch-free and
quick: it reads commit markers only. Exit 0 always, except 2 for arguments the job itself would refuse.
"""

from __future__ import annotations

import contextlib
import io
import sys

from training.checkpoint.layout import latest_complete, parse_step
from training.config import ConfigError, load_config


def describe(train_args: list[str]) -> str:
    with contextlib.redirect_stderr(io.StringIO()):
        directory = load_config(train_args).checkpoint.dir
    newest = latest_complete(directory)
    if newest is None:
        return f"stopped before any checkpoint was saved ({directory} holds none): a rerun starts from the beginning"
    return f"stopped; the newest complete checkpoint is step {parse_step(newest)} ({newest}): a rerun resumes there"


def main(argv: list[str] | None = None) -> int:
    try:
        print(describe(list(sys.argv[1:] if argv is None else argv)))
    except (ConfigError, SystemExit) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

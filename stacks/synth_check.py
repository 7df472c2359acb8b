"""Check a ``make synth`` command line before CDK starts: ``python -m stacks.synth_check PLATFORM [CDK ARGS]``.

The CDK CLI drops what it cannot use without failing: ``-c gpuNodes`` (no value) only prints a note, and an
unknown key is passed to the app, which CDK lets ignore it. Here the context the app would see (cdk.json,
cdk.context.json, then the ``-c key=value`` arguments, later ones winning as in the CLI) is checked the way
``app.py`` checks it, plus what only the command line shows:

* every ``-c``/``--context`` argument is ``key=value``;
* every key is one of ours or CDK's own (``stacks.context_keys``), with the closest known key suggested;
* a ``platform`` key agrees with ``PLATFORM`` (make synth writes ``cdk.out/<PLATFORM>``);
* ``--output`` is not given (make synth lints ``cdk.out/<PLATFORM>``);
* the values make a valid :class:`~stacks.config.InfraConfig` (the same checks as at synth time).

Prints one line on success (what will be synthesized). Exit 2 with ``error: ...`` naming the argument and the
fix otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from stacks.config import ConfigError, InfraConfig

ROOT = Path(__file__).resolve().parents[1]


def context_args(argv: Sequence[str]) -> dict[str, str]:
    """The ``key=value`` pairs of every ``-c``/``--context`` option in ``argv``, in order (later ones win)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-o", "--output") or arg.startswith("--output="):
            raise ConfigError(
                f"{arg}: make synth always writes cdk.out/<PLATFORM> and lints it there; run "
                "`npx cdk synth --output DIR` yourself for another directory"
            )
        if arg in ("-c", "--context"):
            if i + 1 >= len(argv):
                raise ConfigError(f"{arg} at the end of the arguments has no key=value: write {arg} key=value")
            pair, i = argv[i + 1], i + 2
        elif arg.startswith("--context="):
            pair, i = arg.removeprefix("--context="), i + 1
        else:
            i += 1
            continue
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(
                f"-c {pair}: a context option needs a value (CDK would ignore it and use the default); "
                f"write -c {key or 'key'}=VALUE"
            )
        out[key] = value
    return out


def file_context(root: Path = ROOT) -> dict[str, Any]:
    """Context from cdk.json and cdk.context.json (the CLI merges both under the command line's)."""
    ctx = dict(json.loads((root / "cdk.json").read_text()).get("context", {}))
    cached = root / "cdk.context.json"
    if cached.is_file():
        ctx.update(json.loads(cached.read_text()))
    return ctx


def check(platform: str, argv: Sequence[str], root: Path = ROOT) -> InfraConfig:
    """The config ``make synth PLATFORM=platform ARGS="argv"`` would synthesize; raises ConfigError."""
    given = context_args(argv)
    if "platform" in given and given["platform"] != platform:
        raise ConfigError(
            f"-c platform={given['platform']} disagrees with PLATFORM={platform}: make synth takes the "
            f"platform from PLATFORM; run `make synth PLATFORM={given['platform']}` without "
            "-c platform"
        )
    context = {**file_context(root), **given, "platform": platform}
    InfraConfig.check_keys(context)
    return InfraConfig.from_context(context)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        cfg = check(argv[0], argv[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"[synth] {cfg.platform}: {cfg.gpu_nodes} x {cfg.gpu_instance_type}, prefix {cfg.name_prefix}"
        f"{', region ' + cfg.region if cfg.region else ' (env-agnostic)'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

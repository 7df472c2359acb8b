"""Boolean environment variables (DRY_RUN, ...): one truth table for every script and CLI (and
:func:`env_count` for the whole-number ones: NODES, SPARES, NPROC).

    1, true, yes, on            -> true
    0, false, no, off, "" (or unset) -> false
    anything else               -> an error naming the variable, its value and the accepted values

Case-insensitive, surrounding blanks ignored. Standard library only: shell scripts ask it before a venv exists,

    dry=$(python3 -m tools.env_flags DRY_RUN) || exit 2    # prints true or false; exit 2 on a bad value
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


class EnvFlagError(ValueError):
    """A boolean environment variable with a value that is neither true nor false."""


def parse_flag(name: str, value: str | None) -> bool:
    """``value`` of variable ``name`` as a bool (None = unset = false); raises :class:`EnvFlagError`."""
    text = (value or "").strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise EnvFlagError(
        f"{name}={value!r} is neither true nor false: use {'/'.join(TRUE)} for true, "
        f"{'/'.join(FALSE[:-1])} or empty for false"
    )


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """The boolean environment variable ``name`` of ``env`` (default ``os.environ``)."""
    return parse_flag(name, (os.environ if env is None else env).get(name))


def env_count(name: str, default: int | None, minimum: int, env: Mapping[str, str] | None = None) -> int | None:
    """The whole-number environment variable ``name`` (NODES, SPARES, NPROC) of ``env`` (default ``os.environ``),
    ``default`` when unset or empty; raises :class:`EnvFlagError` naming it when it is not a number >= ``minimum``."""
    raw = (os.environ if env is None else env).get(name)
    if not raw:
        return default
    if not raw.strip().isdigit() or int(raw) < minimum:
        raise EnvFlagError(f"{name}={raw!r} is not a whole number >= {minimum}: set it to a count, or unset it")
    return int(raw)


def main(argv: Sequence[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    if not names or names[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if names else 2
    try:
        print("\n".join("true" if env_flag(n) else "false" for n in names))
    except EnvFlagError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which CDK context keys are ours, which belong to CDK, and the closest known key to a mistyped one.

The app's keys are plain camelCase names (``InfraConfig.context_keys()``) plus the two documentation keys of
cdk.json. CDK and its CLI add their own, always namespaced or fixed: feature flags (``@aws-cdk/...``), CLI
settings (``aws:cdk:...``), cached lookups (``availability-zones:account=...:region=...``), and the keys
``cdk acknowledge`` and ``cdk cli-telemetry`` write. Everything else is a mistake worth stopping for: CDK
itself ignores unknown keys, so a typo would silently deploy the defaults.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Mapping

#: cdk.json's documentation entries ("//": overview, "//keys": one line per key).
DOC_KEYS = ("//", "//keys")
#: Keys CDK, its CLI and construct libraries set themselves.
CDK_KEY = re.compile(r"@.+|aws:cdk:.+|cdk:.+|[a-z0-9-]+:account=.+|acknowledged-issue-numbers|cli-telemetry")


def unknown_keys(context: Mapping[str, object], known: Iterable[str]) -> list[str]:
    """Keys of ``context`` that are neither in ``known``, nor documentation, nor CDK's own, sorted."""
    ours = set(known) | set(DOC_KEYS)
    return sorted(k for k in context if k not in ours and not CDK_KEY.fullmatch(k))


def _fold(key: str) -> str:
    """Case and separators dropped: GpuNodes, gpu_nodes and gpu-nodes all fold to gpunodes."""
    return re.sub(r"[^a-z0-9]", "", key.lower())


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` most likely meant (same letters in another spelling, else a near miss), or None."""
    by_fold = {_fold(k): k for k in known}
    if _fold(key) in by_fold:
        return by_fold[_fold(key)]
    match = difflib.get_close_matches(_fold(key), by_fold, n=1, cutoff=0.75)
    return by_fold[match[0]] if match else None


def unknown_keys_message(keys: Iterable[str], known: Iterable[str]) -> str:
    """One line naming each unknown key and its likely meaning, and where the list of keys is."""
    known = list(known)
    parts = []
    for key in keys:
        guess = closest_key(key, known)
        parts.append(f"{key!r} (did you mean {guess}?)" if guess else repr(key))
    many = len(parts) > 1
    return (
        f"unknown context key{'s' * many} {', '.join(parts)}: CDK would ignore {'them' if many else 'it'} and "
        f"deploy the defaults; use the keys `.venv/bin/python app.py --help` lists (camelCase, e.g. gpuNodes=4)"
    )

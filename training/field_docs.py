"""Help text for typed configs: each dataclass field's docstring, read from the source.

One implementation for the three configs that print their fields' docs as help: the training config
(``python -m training --help``), the infrastructure config (``python app.py --help``) and the Slurm job config
(``python -m cluster_assets.slurm.render --help``). It lives in ``training/`` because the training image ships
only ``training/`` and requirements.txt.
"""

from __future__ import annotations

import dataclasses
import functools

from docstring_parser import parse_from_object


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring on one line, in field order, for every documented field of dataclass ``cls``.

    Reads a string literal right after the field (the style of the three configs) and an ``Attributes:``
    section in the class docstring (the launcher's style); the section wins for a field that has both.
    """
    return dict(_field_docs(cls))  # a copy: the cached one is shared


# Cached: reading a class's source costs ~45 ms and every parse of the training config reads nine classes.
@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    # docstring_parser (pinned in requirements.txt) instead of a hand-written ast walk: parse_from_object reads
    # both styles, gave the same text as the three former loaders for every field, is pure Python without
    # dependencies and supports Python 3.8-3.14 (the training image runs 3.13).
    documented = {p.arg_name: p.description for p in parse_from_object(cls).params if p.description}
    return {f.name: " ".join(documented[f.name].split()) for f in dataclasses.fields(cls) if f.name in documented}

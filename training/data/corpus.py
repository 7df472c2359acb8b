"""A text corpus on disk, read without torch: the files a ``data.source`` names, their texts, and how many
byte-level tokens and samples they make.

Training (:mod:`training.data`) and the checks before a job starts (:mod:`training.preflight`) read files
through these functions, so a bad file gets the same one-line message wherever it is found::

    files = data_files("/fsx/corpus")                 # sorted .jsonl/.parquet files, or DataSourceError
    for text in iter_texts(files[0], "text"): ...     # DataSourceError names the file, line and fix
    raw, target = raw_length_for(seq_len=512, noise_density=0.15, mean_span=3.0)
"""

from __future__ import annotations

import glob
import json
import os
import stat
from typing import Iterator

from training.config import ConfigError

EXTENSIONS = (".jsonl", ".parquet")
FIX = "pass a .jsonl file (one JSON object per line), a .parquet file, a directory of them, or 'builtin'"


class DataSourceError(ConfigError):
    """``data.source`` cannot be read as a corpus; the message names the file, the problem and the fix."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_file(path: str, what: str) -> None:
    """A regular, readable file (a FIFO is never opened: reading one would wait forever)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataSourceError(f"{what} {path!r} cannot be read: {e.strerror}; {FIX}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataSourceError(f"{what} {path!r} is {_kind(st.st_mode)}, not a file of text; {FIX}")
    if not os.access(path, os.R_OK):
        raise DataSourceError(
            f"{what} {path!r} is not readable by this user (mode {stat.filemode(st.st_mode)}); "
            "make it readable or copy it to a place this job can read"
        )


def data_files(source: str, *, name: str = "data.source") -> list[str]:
    """The corpus files of ``source``: the file itself, or every .jsonl/.parquet file below a directory.
    ``name``: what the running command calls ``source`` in its messages (``SRC`` for ``prepare``)."""
    if not os.path.lexists(source):
        raise DataSourceError(f"{name}={source!r} does not exist; {FIX}")
    if os.path.isdir(source):
        if not os.access(source, os.R_OK | os.X_OK):
            raise DataSourceError(f"{name}={source!r} is a directory this user cannot list; make it readable")
        files = sorted(f for ext in EXTENSIONS for f in glob.glob(os.path.join(source, f"**/*{ext}"), recursive=True))
        if not files:
            raise DataSourceError(f"{name}={source!r} is a directory with no .jsonl or .parquet files in it; {FIX}")
        for f in files:
            _check_file(f, "data file")
        return files
    _check_file(source, name)
    if not source.endswith(EXTENSIONS):
        raise DataSourceError(f"{name}={source!r} is neither .jsonl nor .parquet (by its name); {FIX}")
    return [source]


def iter_texts(path: str, text_field: str, *, field_flag: str = "--data.text_field") -> Iterator[str]:
    """The documents of one corpus file, in order: the string values of ``text_field`` (a null value, JSON's or
    parquet's, is no document). Raises :class:`DataSourceError` at the first bad record; its fix names
    ``field_flag``, the running command's option for ``text_field`` (``--text-field`` for ``prepare``)."""
    if path.endswith(".jsonl"):
        yield from _jsonl_texts(path, text_field, field_flag)
    else:
        yield from _parquet_texts(path, text_field, field_flag)


_JSON_TYPES = ((bool, "boolean"), (int, "number"), (float, "number"), (list, "array"), (dict, "object"))


def _json_type(value: object) -> str:
    return next(name for kind, name in _JSON_TYPES if isinstance(value, kind))  # bool first: a bool is an int


def _jsonl_texts(path: str, text_field: str, field_flag: str) -> Iterator[str]:
    with open(path, "rb") as f:  # bytes, decoded per line: a decoding error then names its line
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataSourceError(
                    f"{path}:{n} is not UTF-8 text ({e.reason} at byte {e.start}); convert the file to UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataSourceError(
                    f"{path}:{n} is not JSON ({e.msg} at column {e.colno}); a .jsonl file "
                    "holds one JSON object per line"
                ) from None
            if not isinstance(rec, dict):
                raise DataSourceError(
                    f"{path}:{n} is a JSON {type(rec).__name__}, not an object; write one "
                    f'object per line, e.g. {{"{text_field}": "..."}}'
                )
            if text_field not in rec:
                keys = ", ".join(sorted(map(str, rec))[:8]) or "none"
                raise DataSourceError(
                    f"{path}:{n} has no field {text_field!r} (its fields: {keys}); set "
                    f"{field_flag} to the field that holds the text"
                )
            text = rec[text_field]
            if text is None:
                continue  # no document here, as a null in a parquet column
            if not isinstance(text, str):  # str() would train on a number's digits or a list's Python repr
                raise DataSourceError(
                    f"{path}:{n} field {text_field!r} holds a JSON {_json_type(text)} "
                    f"({json.dumps(text)[:40]}), not a string; set {field_flag} to the field "
                    "that holds the text"
                )
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # a JSON escape such as "\ud800": valid JSON, not encodable text
                raise DataSourceError(
                    f"{path}:{n} field {text_field!r} holds a lone surrogate "
                    f"(U+{ord(e.object[e.start]):04X} at character {e.start}), which is not text; "
                    "fix or drop that escape in the file"
                ) from None
            yield text


def _is_text(kind) -> bool:
    """An arrow type whose values are strings (plain, large, view, or dictionary-encoded)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _parquet_texts(path: str, text_field: str, field_flag: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # only for parquet sources

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a file that is not parquet
        raise DataSourceError(f"{path} is not a readable parquet file ({str(e).splitlines()[0][:200]})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise DataSourceError(
            f"{path} has no column {text_field!r} (its columns: {', '.join(schema.names[:8])}); "
            f"set {field_flag} to the column that holds the text"
        )
    kind = schema.field(text_field).type
    if not _is_text(kind):  # str() would train on an integer's digits or a list's Python repr
        texts = [f.name for f in schema if _is_text(f.type)]
        raise DataSourceError(
            f"{path} column {text_field!r} is of type {kind}, not string; set {field_flag} to a "
            f"column of text (its string columns: {', '.join(texts[:8]) or 'none'})"
        )
    for batch in pf.iter_batches(columns=[text_field]):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value


def token_count(text: str) -> int:
    """Byte-level tokens of one document in the stream (its UTF-8 bytes and an end-of-sequence token)."""
    return len(text.encode("utf-8")) + 1


def span_lengths(raw_len: int, noise_density: float, mean_span: float) -> tuple[int, int]:
    """(noise tokens, noise spans) for a raw window, as in T5's random_spans_noise_mask."""
    num_noise = min(max(int(round(raw_len * noise_density)), 1), raw_len - 1)
    num_spans = max(int(round(num_noise / mean_span)), 1)
    return num_noise, num_spans


def raw_length_for(seq_len: int, noise_density: float, mean_span: float) -> tuple[int, int]:
    """Largest raw window whose corrupted input (+EOS) fits seq_len, and the target length it needs."""
    raw = seq_len
    while True:
        noise, spans = span_lengths(raw + 1, noise_density, mean_span)
        if raw + 1 - noise + spans + 1 > seq_len:
            break
        raw += 1
    noise, spans = span_lengths(raw, noise_density, mean_span)
    return raw, noise + spans + 1

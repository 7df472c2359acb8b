"""The worker's one-line error reaches stderr in one write (the agent shares the stream)."""

from __future__ import annotations

import io
import sys

from training.errors import print_error


class _Writes(io.StringIO):
    """A stream that keeps each write apart, as an unbuffered pipe does."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_the_error_and_its_newline_are_one_write(monkeypatch):
    # With PYTHONUNBUFFERED (how workers run), print() writes the text and the newline apart, and CI once saw
    # torchrun's "Closing process ... via signal SIGTERM" glued onto the end of a worker's error line.
    stream = _Writes()
    monkeypatch.setattr(sys, "stderr", stream)
    print_error(ValueError("shard tokens-00001.bin is damaged"))
    assert stream.writes == ["error: shard tokens-00001.bin is damaged\n"]

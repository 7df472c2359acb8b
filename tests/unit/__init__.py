"""Unit tier: pure functions and in-process objects; no process, no socket (tests/unit/conftest.py enforces it)."""

"""The unit tier's promise, enforced: a test here starts no process and opens no connection.

Python's audit hooks (sys.addaudithook, PEP 578) report every process start (subprocess.Popen, os.posix_spawn,
os.fork, os.exec*, os.system, ...) and every socket connect or datagram send made through Python's socket module.
While a unit-tier test is set up, runs or is torn down, and while a unit-tier module is imported (`import aws_cdk`
starts node), such an event raises UnitTierViolation where it happens, and the test fails even when the code under
test catches that error. A test that needs a process or a socket belongs in tests/integration/.

What the hook cannot see is checked another way or left out, on purpose:
* multiprocessing's spawn and forkserver start methods raise no audit event (they call _posixsubprocess directly),
  so the CPU time of reaped children (os.times()) is compared too: children that ran mean a process was started;
* a bind alone is not watched: urllib3 binds ::1 at import to learn whether the host has IPv6 (boto3 imports it),
  and a listening socket nobody connects to is no connection;
* sockets opened in C++ (torch's TCPStore, gloo's pairs) raise no event: such tests were placed in integration by
  reading them (a TCPStore barrier, a 2-rank gloo world).

Nothing is replaced: the hook only watches (an audit hook cannot be removed, so it stays installed and is idle
outside the unit tier). Threads that were running before the test began (pytest-xdist's I/O thread, a daemon an
earlier integration test left) are not the test's and are not watched.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent

#: Audit events (docs.python.org/3/library/audit_events.html) that start a process or use the network.
WATCHED = frozenset(
    {
        "subprocess.Popen",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.system",
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
    }
)


class UnitTierViolation(RuntimeError):
    """A unit-tier test started a process or used a socket. Not an OSError, so code that handles a failed spawn or
    connection does not take it for one."""


#: Children's CPU time counts when they are reaped, which may happen during a later test (a Popen or process object of
#: an earlier one collected there): twice in three full runs a unit test was blamed for 0.08 s reaped while it ran. A
#: multiprocessing child imports the project's modules (seconds), so a threshold above such reaps still catches one.
CHILD_CPU_NOISE_S = 0.25


class _Watch:
    def __init__(self) -> None:
        self.what: str | None = None  # the test or module being watched; None: not watching
        self.ignored: set[int] = set()  # threads that were running before it began
        self.seen: list[str] = []
        self.children_s = 0.0  # CPU time of the reaped children when it began

    @staticmethod
    def _children_cpu_s() -> float:
        times = os.times()
        return times.children_user + times.children_system

    def start(self, what: str) -> None:
        self.ignored = {t.ident for t in threading.enumerate() if t.ident is not None} - {threading.get_ident()}
        self.seen = []
        self.children_s = self._children_cpu_s()
        self.what = what

    def stop(self) -> list[str]:
        self.what = None
        grew = self._children_cpu_s() - self.children_s
        if grew > CHILD_CPU_NOISE_S:
            self.seen.append(f"child processes ran: their CPU time grew by {grew:.2f} s (os.times())")
        return self.seen

    def audit(self, event: str, args: tuple) -> None:
        if self.what is None or event not in WATCHED or threading.get_ident() in self.ignored:
            return
        line = f"{event}{args!r}"[:300]
        self.seen.append(line)
        raise UnitTierViolation(
            f"{self.what}: a unit-tier test must not start a process or use a socket ({line}); "
            f"a test that needs one belongs in tests/integration/"
        )


_WATCH = _Watch()
sys.addaudithook(_WATCH.audit)


def _failure(seen: list[str]) -> str:
    return (
        "started a process or used a socket (or the code under test swallowed the error raised for it); a "
        "unit-tier test must do neither, one that needs it belongs in tests/integration/ (tests/unit/conftest.py): "
        + "; ".join(seen)
    )


def _guarded(what: str) -> Iterator[None]:
    _WATCH.start(what)
    try:
        result = yield
    finally:
        seen = _WATCH.stop()
    if seen:
        pytest.fail(_failure(seen), pytrace=False)
    return result


def _in_unit(path: Path) -> bool:
    return path.resolve().is_relative_to(UNIT)


# Setup, call and teardown hooks reach this conftest only for items under tests/unit (pytest picks an item's hooks
# by its path); the check of the path is for a direct `pytest` call with a plugin that changes that.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item.nodeid)) if _in_unit(item.path) else (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item.nodeid)) if _in_unit(item.path) else (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item.nodeid)) if _in_unit(item.path) else (yield)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    """A unit-tier module is watched while it is imported (collected): a module-level `import aws_cdk` starts node."""
    if not (isinstance(collector, pytest.Module) and _in_unit(collector.path)):
        return (yield)
    _WATCH.start(str(collector.path))
    try:
        report = yield
    finally:
        seen = _WATCH.stop()
    if seen and report.passed:
        report.outcome = "failed"
        report.longrepr = _failure(seen)
    return report

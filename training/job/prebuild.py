"""Work that needs no process group, started on a thread while this process waits for its group to form.

An in-place recovery's survivors wait for the replacement's check-in (0.3-0.9 s on the test CPU) and the
replacement waits for the survivors' decision and the new group; the model's meta-device build (0.2-0.3 s for the
tiny model on a loaded 2-core host, the T5 constructor recorded, no collective, no mesh) runs meanwhile. What
follows it cannot: ``fully_shard`` needs the new group's mesh (its rank and world size decide the shards), and the
materialisation and restore need the sharded parameters. The recording's dispatch mode is thread-local in torch,
so the waiting thread's own tensor work is not recorded.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Prebuild(Generic[T]):
    """``build()`` on a daemon thread from now; :meth:`result` waits for it (and raises what it raised)."""

    def __init__(self, build: Callable[[], T], name: str = "prebuild"):
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(build,), name=name, daemon=True)
        self._thread.start()

    def _run(self, build: Callable[[], T]) -> None:
        try:
            self._result = build()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by result()
            self._error = e

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

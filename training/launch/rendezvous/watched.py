"""A key, or the keys under a prefix, of the job in etcd as one watch last delivered them (:class:`Watched`).

The handler's parts each watch what they act on: every agent the round's head, the closer every key of the job,
an agent waiting to be the closer the member created just before its own. A thread per view resyncs (a broken
or idle stream may have missed events) and watches from the revision it read; ``changed`` wakes the waiters.
"""

from __future__ import annotations

import threading
from typing import Callable

from training.launch.rendezvous.client import EtcdClient, KeyValue, shut_stream


class Watched:
    """Keys under ``prefix`` (or the one key ``prefix``, ``single_key``) as a watch last delivered them;
    ``changed`` is notified on every change. ``connected``: the last resync succeeded."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        name: str,
        single_key: bool = False,
        on_change: Callable[[], None] | None = None,
    ):
        self.client, self.prefix, self.single_key = client, prefix, single_key
        self.on_change = on_change  # called on the watch's thread after each change is applied (and each resync)
        self.keys: dict[str, KeyValue] = {}
        self.changed = threading.Condition()
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stream = None  # the open watch stream, which stop() shuts
        self._stream_lock = threading.Lock()

    def start(self) -> "Watched":
        self._thread.start()
        return self

    def stop(self, join_s: float = 0.0) -> None:
        """Stop watching: the stream is shut, so its thread ends now, not at the next progress notice or the
        stream's idle bound (torch expects a handler's threads gone after shutdown); waits ``join_s`` for it."""
        self._stop.set()
        with self._stream_lock:
            stream = self._stream
        if stream is not None:
            shut_stream(stream)
        with self.changed:
            self.changed.notify_all()
        if join_s > 0 and self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)

    def _opened(self, stream) -> None:
        with self._stream_lock:
            self._stream = stream
            stopping = self._stop.is_set()
        if stopping:  # stop() came between the stream's opening and now: it found no stream to shut
            shut_stream(stream)

    def get(self, key: str) -> KeyValue | None:
        with self.changed:
            return self.keys.get(key)

    def under(self, prefix: str) -> list[KeyValue]:
        with self.changed:
            return [kv for k, kv in self.keys.items() if k.startswith(prefix)]

    def wait(self, timeout_s: float) -> None:
        with self.changed:
            self.changed.wait(timeout_s)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Until ``predicate()`` (checked under the view's lock, so no change slips between check and wait)."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    def _apply(self, kind: str, kv: KeyValue) -> None:
        with self.changed:
            if kind == "DELETE":
                self.keys.pop(kv.key, None)
            else:
                self.keys[kv.key] = kv
            self.changed.notify_all()
        if self.on_change is not None:
            self.on_change()

    def _resync(self) -> int:
        if self.single_key:
            kv, rev = self.client.get_with_revision(self.prefix)
            kvs = [kv] if kv else []
        else:
            kvs, rev = self.client.get_prefix(self.prefix)
        with self.changed:
            self.keys = {kv.key: kv for kv in kvs}
            self.connected = True
            self.changed.notify_all()
        if self.on_change is not None:
            self.on_change()
        return rev

    def _run(self) -> None:
        while not self._stop.is_set():
            try:  # resync: a broken or idle stream may have missed events
                rev = self._resync()
            except Exception:  # noqa: BLE001 - no member answers: the keep-alive thread says so; keep trying
                with self.changed:
                    self.connected = False
                self._stop.wait(0.2)
                continue
            try:
                self.client.watch(
                    self.prefix, rev + 1, self._apply, self._stop, single_key=self.single_key, on_open=self._opened
                )
            except Exception:  # noqa: BLE001 - the member went, or the stream idled out: resync and watch again
                pass

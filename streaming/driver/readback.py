"""A read the driver's timer asks for and does not wait on: one at a time, on a thread of its own.

With ``--driver-replicas not-ok`` the monitor reads a silent broker's ok followers back from
the state table (``Monitor._hold_silent``). That read is a Spark job: ~1 s for one broker of a
100k-replica fleet on 3 brokers, ~6 s at 1M (docs/benchmarks.md). Run on the timer, it held up
everything else the timer does in the moment the job exists for: the stale check, the other
followers' crossings, the query's failure check. Here it runs on one thread kept for the job's
life (under PySpark's pinned threads one JVM thread, not one per read); the timer asks and goes
on, and what was read is handed to ``take`` when it is in.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from isrwatch.logs import kv

__all__ = ["ReadBack"]

log = logging.getLogger("streaming.monitor")

Asked = TypeVar("Asked")
Found = TypeVar("Found")


class ReadBack(Generic[Asked, Found]):
    """``read(asked)`` on the reader's thread, then ``take(asked, found)``, or ``fail(asked,
    error)`` when the read raised. ``ask`` starts a read unless one is under way."""

    def __init__(
        self,
        read: Callable[[Asked], Found],
        take: Callable[[Asked, Found], None],
        fail: Callable[[Asked, Exception], None],
        name: str,
    ) -> None:
        self._read, self._take, self._fail, self._name = read, take, fail, name
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._asked: queue.SimpleQueue[tuple[Asked] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def ask(self, asked: Asked) -> bool:
        """Read ``asked`` in the background; False (nothing started) while a read is under way
        or once closed: the caller asks again at its next tick if it still wants it."""
        with self._lock:
            if self._closed or not self._idle.is_set():
                return False
            self._idle.clear()
            if self._thread is None:  # started at the first read: most jobs never need one
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._asked.put((asked,))  # (under the lock: never behind close's end mark)
        return True

    def _run(self) -> None:
        while (item := self._asked.get()) is not None:
            try:
                self._one(item[0])
            except Exception:  # a failure taking the result in must not end the reader
                log.exception("read_back_failed %s", kv(reader=self._name))
            finally:
                self._idle.set()

    def _one(self, asked: Asked) -> None:
        try:
            found = self._read(asked)
        except Exception as e:  # noqa: BLE001 - said by fail; the next ask reads again
            self._fail(asked, e)
            return
        self._take(asked, found)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until no read is under way (True), or ``timeout_s`` passed (False)."""
        return self._idle.wait(timeout_s)

    def close(self, timeout_s: float) -> None:
        """No more reads; wait up to ``timeout_s`` for one under way (before Spark stops under it)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._asked.put(None)
            thread.join(timeout_s)

"""What the job knows of its query, from Spark's own events.

``QueryEvents`` is a ``StreamingQueryListener``: Spark calls it (on a thread of
its own) when the job's query starts, completes a micro-batch, finds no new
data, or ends. The job waits on its events instead of polling the query's
status: ``ready`` once the query has looked at its source a first time (the
embedded simulator starts then), ``ended`` with the reason when it stops.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener

if TYPE_CHECKING:
    import uuid

    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
    )

__all__ = ["QueryEvents"]

log = logging.getLogger("streaming.listener")


class QueryEvents(StreamingQueryListener):
    def __init__(self, name: str) -> None:
        self.name = name
        self.id: str | None = None
        self.ready = threading.Event()  # a first trigger ran (a batch, or no new data)
        self.ended = threading.Event()
        self.error: str | None = None  # why the query ended, when it failed
        self.batches = 0
        self.input_rows = 0

    def _mine(self, query_id: uuid.UUID) -> bool:
        return self.id is not None and str(query_id) == self.id

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        if event.name == self.name:
            self.id = str(event.id)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        if self._mine(event.progress.id):
            self.batches += 1
            self.input_rows += int(event.progress.numInputRows or 0)
            self.ready.set()

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        if self._mine(event.id):
            self.ready.set()

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        if self._mine(event.id):
            self.error = event.exception
            self.ended.set()
            self.ready.set()

    def restart(self) -> None:
        """Before the job starts its query again: the ended one's events are the past (the
        new query has a new id, set when Spark says it started)."""
        self.id = None
        self.error = None
        self.ended.clear()

    def failure(self) -> str | None:
        """One line saying why the query ended, or None while it runs."""
        if not self.ended.is_set():
            return None
        return f"query {self.name} stopped: {(self.error or 'no reason given').splitlines()[0]}"

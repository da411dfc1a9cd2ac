"""The job's output producer: writes to isrwatch's own topics never block a micro-batch.

A record for a partition whose leader hangs waits in librdkafka's queue; once the
queue is full, ``produce`` raises ``BufferError``, and a job that waited for
room stopped evaluating exactly while a broker misbehaved. ``OutputProducer``
takes the place of the confluent-kafka producer for the state topic, the alerts
topic and the dead-letter topic (same ``produce``/``poll``/``flush``/``len``)
and never raises ``BufferError``: what does not fit is held here, bounded, and
offered again at every later call.

* On the compacted state topic only the newest record of a key matters: a held
  state record is replaced by a newer one of the same replica (at most one per
  replica is held, and nothing older can be delivered after it).
* Alerts and dead letters are held in order, at most ``max_held`` of them; past
  that the oldest are dropped and counted.

Per topic it counts what is pending (in librdkafka's queue or held), dropped and
failed (librdkafka gave up: ``message.timeout.ms``), for
``isrwatch_output_records_pending`` and ``isrwatch_output_records_lost_total``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from isrwatch.logs import kv

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

__all__ = ["OutputProducer", "OutputStats", "RecordProducer"]


class RecordProducer(Protocol):
    """What writes a topic: ``streaming.sinks.producer.OutputProducer``, or a confluent_kafka.Producer."""

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def __len__(self) -> int: ...


log = logging.getLogger("streaming.producer")


@dataclass(frozen=True)
class OutputStats:
    pending: int
    dropped: int  # held past max_held
    failed: int  # librdkafka gave up on it


class OutputProducer:
    def __init__(self, producer: Producer, latest_wins: Collection[str] = (), max_held: int = 100_000) -> None:
        self.producer = producer
        self.latest_wins = frozenset(latest_wins)
        self.max_held = max_held
        self._keyed: OrderedDict[tuple[str, bytes | None], bytes | None] = OrderedDict()
        self._queued: deque[tuple[str, bytes | None, bytes | None]] = deque()
        self._inflight: dict[str, int] = {}
        self._dropped: dict[str, int] = {}
        self._failed: dict[str, int] = {}
        self._lock = threading.Lock()  # the held records
        # the counts: delivery reports run in whichever thread polls (a batch, a stale alert
        # from the job's timer, a /metrics scrape), never while librdkafka is called under it
        self._count_lock = threading.Lock()
        self._last_log = 0.0

    def __len__(self) -> int:
        return len(self.producer) + len(self._keyed) + len(self._queued)

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> None:
        with self._lock:
            self._offer_held()
            if topic in self.latest_wins:
                if (topic, key) in self._keyed or not self._try(topic, key, value):
                    self._keyed[(topic, key)] = value  # newest wins; keeps its place in line
                    self._keyed.move_to_end((topic, key))
            elif self._queued or not self._try(topic, key, value):
                self._queued.append((topic, key, value))
                while len(self._queued) > self.max_held:
                    dropped_topic, _, _ = self._queued.popleft()
                    self._dropped[dropped_topic] = self._dropped.get(dropped_topic, 0) + 1
            self._log_held()

    def _try(self, topic: str, key: bytes | None, value: bytes | None) -> bool:
        try:
            self.producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
        except BufferError:
            return False
        with self._count_lock:
            self._inflight[topic] = self._inflight.get(topic, 0) + 1
        return True

    def _offer_held(self) -> None:
        """Send what was held, oldest first, until librdkafka's queue is full again."""
        while self._keyed:
            (topic, key), value = next(iter(self._keyed.items()))
            if not self._try(topic, key, value):
                return
            del self._keyed[(topic, key)]
        while self._queued:
            topic, key, value = self._queued[0]
            if not self._try(topic, key, value):
                return
            self._queued.popleft()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        topic = cast(str, msg.topic())  # a delivery report's message has its topic
        with self._count_lock:
            self._inflight[topic] = self._inflight.get(topic, 1) - 1
            if err is not None:
                self._failed[topic] = self._failed.get(topic, 0) + 1
        if err is not None:
            now = time.monotonic()
            if now - self._last_log > 10:
                self._last_log = now
                log.warning(kv(event="output_not_delivered", topic=topic, error=err.str(), failed=self._failed[topic]))

    def _log_held(self) -> None:
        held = len(self._keyed) + len(self._queued)
        now = time.monotonic()
        if held and now - self._last_log > 10:
            self._last_log = now
            log.warning(kv(event="outputs_held", records=held, hint="a leader of an isrwatch topic does not answer"))

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            self._offer_held()
        return int(self.producer.poll(timeout))

    def flush(self, timeout: float = 10.0) -> int:
        """Deliver everything, held records included, within ``timeout``; returns what is left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._offer_held()
            left = self.producer.flush(max(0.0, min(1.0, deadline - time.monotonic())))
            if (left == 0 and not self._keyed and not self._queued) or time.monotonic() >= deadline:
                return len(self)

    def holds(self, topic: str) -> bool:
        """Whether records of ``topic`` are pending (not yet acknowledged, or held): one of its
        leaders does not answer. The executors' writers then leave that topic's next records to
        the driver (``streaming.sinks.statewriter``, ``streaming.sinks.letterwriter``)."""
        stats = self.stats().get(topic)
        return stats is not None and stats.pending > 0

    def stats(self) -> dict[str, OutputStats]:
        """Per topic: pending, dropped, failed, as of now (delivery reports that librdkafka
        has ready are served first, so a record already acknowledged is not pending)."""
        self.producer.poll(0)
        with self._lock:
            held: dict[str, int] = {}
            for topic, _ in self._keyed:
                held[topic] = held.get(topic, 0) + 1
            for topic, _, _ in self._queued:
                held[topic] = held.get(topic, 0) + 1
            dropped = dict(self._dropped)
        with self._count_lock:
            inflight, failed = dict(self._inflight), dict(self._failed)
        topics = set(inflight) | set(held) | set(dropped) | set(failed)
        return {
            t: OutputStats(max(0, inflight.get(t, 0)) + held.get(t, 0), dropped.get(t, 0), failed.get(t, 0))
            for t in sorted(topics)
        }

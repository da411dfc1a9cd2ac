"""The exporter's only Kafka I/O: a consumer of the compacted state topic
feeding a ``StatusStore``.

It assigns itself every partition of the topic from the beginning (no group
membership, no commits: the topic is compacted, so reading it whole is the
current state), applies each record in order (a status replaces the replica's,
a tombstone removes it), picks up partitions added later and expires replicas
whose status stopped being refreshed (a deleted topic).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from exporter.kafka_metadata import first_metadata
from exporter.store import StatusStore
from isrwatch.exceptions import UnreachableError
from isrwatch.logs import kv
from isrwatch.status import ReplicaStatus, status_from_record

__all__ = ["StateTopicConsumer"]

log = logging.getLogger(__name__)


class _Once(logging.Filter):
    """librdkafka repeats a failing connection's line many times a second:
    let each distinct message through once a minute."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        msg, now = record.getMessage(), time.monotonic()
        if now - self._seen.get(msg, -self.every_s) < self.every_s:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[msg] = now
        return True


_LIBRDKAFKA = logging.getLogger("exporter.librdkafka")
_LIBRDKAFKA.addFilter(_Once())


class StateTopicConsumer:
    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str,
        store: StatusStore,
        *,
        expire_after_ms: int = 300_000,
        housekeeping_s: float = 10.0,
    ) -> None:
        self.topic = topic
        self.store = store
        self.expire_after_ms = expire_after_ms
        self.housekeeping_s = housekeeping_s
        self.bootstrap_servers = str(kafka_config.get("bootstrap.servers", ""))
        config = {
            "group.id": f"isrwatch-exporter-{uuid.uuid4().hex[:8]}",  # never joined: assign() only
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
            "client.id": "isrwatch-exporter",
            **kafka_config,
        }
        self._config = config
        self._consumer = Consumer(config, logger=_LIBRDKAFKA)
        self._assigned: set[int] = set()
        self.records = 0
        store.health.count_unreadable(0)  # isrwatch_state_records_unreadable_total, served from 0
        self.errors = 0  # unexpected errors the consuming loop survived (run)
        self._last_error: str | None = None

    def connect(self, timeout_s: float) -> None:
        """Reach the cluster and assign the topic's partitions; UnreachableError
        (one line) if no broker answers within ``timeout_s``."""
        try:
            first_metadata(self._config, timeout_s)  # any broker: one that hangs must not fail the start
        except KafkaException as e:
            self._consumer.close()
            err = e.args[0] if e.args else e
            detail = err.str() if isinstance(err, KafkaError) else str(err)
            raise UnreachableError(
                f"cannot reach Kafka at {self.bootstrap_servers} within {timeout_s:g}s ({detail}); "
                "check --bootstrap-servers and --kafka-config"
            ) from None
        self.refresh_partitions(timeout_s)

    def refresh_partitions(self, timeout_s: float = 10.0) -> int:
        """Assign partitions not assigned yet (the topic may appear or grow
        after start-up); returns how many were added."""
        try:
            # any broker: asked alone, one that hangs held the loop 10 s and read as the cluster down
            meta = first_metadata(self._config, timeout_s, self.topic)
        except KafkaException as e:
            log.warning(kv(event="state_topic_metadata_failed", topic=self.topic, error=e))
            self._last_error = str(e)
            self.store.health.set_up(False)
            return 0
        self._reachable()
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            if not self._assigned:
                log.info(kv(event="state_topic_waiting", topic=self.topic, reason="not created yet"))
            return 0
        new = sorted(set(topic.partitions) - self._assigned)
        if new:
            self._consumer.incremental_assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in new])
            self._assigned.update(new)
            log.info(kv(event="state_topic_assigned", topic=self.topic, partitions=len(self._assigned)))
        return len(new)

    def poll(self, timeout_s: float = 1.0, max_records: int = 1000) -> int:
        """Apply what arrives within ``timeout_s``; returns records applied."""
        messages = self._consumer.consume(num_messages=max_records, timeout=timeout_s)
        latest: dict[str, ReplicaStatus | None] = {}
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._on_error(err)
                continue
            key = msg.key()
            if key is None:
                self._skip("state_record_without_key", partition=msg.partition(), offset=msg.offset())
                continue
            k = key.decode("utf-8", "replace")
            value = msg.value()
            if value is None:
                latest[k] = None  # tombstone
                continue
            try:
                # any bytes: a status, or ValueError with the reason (fields of a newer job are left out)
                latest[k] = status_from_record(value)
            except ValueError as e:
                self._skip("state_record_unreadable", key=k, partition=msg.partition(), offset=msg.offset(), reason=e)
        if any(m.error() is None for m in messages):
            self._reachable()
        if latest:
            # the last record per key wins, so removals and updates can be applied apart
            self.store.remove([k for k, s in latest.items() if s is None])
            self.store.update([s for s in latest.values() if s is not None])
            self.records += len(latest)
        return len(latest)

    def _skip(self, event: str, **where: object) -> None:
        """A record that is not a state record: counted once (the metric, which the
        progress line reads too) and said with where it is."""
        self.store.health.count_unreadable()
        log.warning(kv(event=event, **where))

    def _reachable(self) -> None:
        if self._last_error is not None:
            self._last_error = None
            self.store.health.set_up(True)
            log.info(kv(event="state_topic_reachable", topic=self.topic))

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT) or err.fatal():
            if self._last_error is None:
                log.warning(kv(event="state_topic_unreachable", topic=self.topic, error=err.str()))
            self._last_error = err.str()
            self.store.health.set_up(False)
        else:
            log.warning(kv(event="state_topic_error", topic=self.topic, error=err.str()))

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; housekeeping (new partitions,
        expiry, a progress line) every ``housekeeping_s``."""
        next_housekeeping = time.monotonic() + self.housekeeping_s
        while not stop.is_set():
            try:
                self.poll(timeout_s=0.5)
                if time.monotonic() >= next_housekeeping:
                    next_housekeeping = time.monotonic() + self.housekeeping_s
                    self.housekeeping()
            except Exception as e:  # noqa: BLE001 - this thread is the gauges' only feed: it must not end
                # Bad records are refused one by one in poll; this is anything else, never
                # seen: said, with its traceback, and the loop goes on a second later.
                self.errors += 1
                log.exception(kv(event="state_consumer_error", errors=self.errors, error=type(e).__name__))
                stop.wait(1.0)

    def housekeeping(self) -> None:
        self.refresh_partitions()
        expired = self.store.expire(self.expire_after_ms)
        snap = self.store.snapshot()
        log.info(
            kv(
                event="exporter_progress",
                topic=self.topic,
                records=self.records,
                bad_records=snap.unreadable or 0,  # isrwatch_state_records_unreadable_total
                replicas=len(snap),
                partitions=len(snap.partitions),
                expired=len(expired),
                up=int(snap.up),
            )
        )

    def close(self) -> None:
        self._consumer.close()

"""Publishes a round's observations as telemetry records (confluent-kafka producer)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from isrwatch.logs import kv
from isrwatch.telemetry import IsrChange, Observation, TelemetryRecord, encode_record

__all__ = ["TelemetryPublisher", "batch_records"]

log = logging.getLogger(__name__)


def batch_records(
    cluster: str,
    observations: Sequence[Observation],
    isr_changes: Sequence[IsrChange],
    max_observations: int,
    sent_ms: int | None = None,
) -> list[TelemetryRecord]:
    """The round as few records as fit: ``max_observations`` per record, ISR changes in the first."""
    sent = int(time.time() * 1000) if sent_ms is None else sent_ms
    chunks = [observations[i : i + max_observations] for i in range(0, len(observations), max_observations)]
    if not chunks and isr_changes:
        chunks = [[]]
    return [
        TelemetryRecord(
            cluster=cluster,
            source="collector",
            sent_ms=sent,
            observations=tuple(chunk),
            isr_changes=tuple(isr_changes) if i == 0 else (),
        )
        for i, chunk in enumerate(chunks)
    ]


class TelemetryPublisher:
    def __init__(self, config: dict[str, Any], topic: str, cluster: str) -> None:
        self.topic = topic
        self.cluster = cluster
        self.producer = Producer({"linger.ms": 5, "compression.type": "none", **config})
        self.delivered = 0
        self.failed = 0
        self._last_error_log = 0.0

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        now = time.monotonic()
        if now - self._last_error_log > 10:
            self._last_error_log = now
            log.warning(kv(event="telemetry_not_delivered", topic=self.topic, error=err.str(), failed=self.failed))

    def publish(self, records: Sequence[TelemetryRecord]) -> None:
        key = self.cluster.encode()
        for record in records:
            value = encode_record(record)
            while True:
                try:
                    self.producer.produce(self.topic, value=value, key=key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.1)
        self.producer.poll(0)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for outstanding records; returns how many are still undelivered."""
        return int(self.producer.flush(timeout_s))

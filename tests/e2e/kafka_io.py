"""Kafka traffic for the e2e tests: produce load, and reading a topic back.

* ``ProduceLoad``: a producer thread (confluent-kafka, acks=1) at a given rate.
* ``produce_waiting``: one record, waiting while the producer's queue is full.
* ``read_records`` / ``read_topic``: every record of a topic up to its end offsets now.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["ProduceLoad", "end_offsets", "produce_waiting", "read_records", "read_topic"]


def produce_waiting(producer: Any, topic: str, **record: Any) -> None:
    """``producer.produce(topic, **record)``, polling while its queue is full (``BufferError``:
    a burst or a flood of big records outruns the brokers) instead of failing."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


class ProduceLoad(threading.Thread):
    """Produces ``rate`` messages/s of ``size`` bytes round-robin over ``partitions`` until stopped."""

    def __init__(self, cluster: Any, topic: str, partitions: int, rate: float, size: int = 200) -> None:
        super().__init__(name=f"load-{topic}", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer(
            cluster.client_config(**{"acks": "1", "linger.ms": "5", "queue.buffering.max.kbytes": "65536"})
        )
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.payload = os.urandom(size // 2).hex().encode()[:size]
        self.stop_event = threading.Event()
        self.sent = 0

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def run(self) -> None:
        tick = 0.02
        next_t = time.monotonic()
        owed = 0.0
        while not self.stop_event.is_set():
            owed += self.rate * tick
            while owed >= 1:
                produce_waiting(self.producer, self.topic, value=self.payload, partition=self.sent % self.partitions)
                self.sent += 1
                owed -= 1
            self.producer.poll(0)
            next_t += tick
            self.stop_event.wait(max(0.0, next_t - time.monotonic()))
            if next_t < time.monotonic() - 1:
                next_t, owed = time.monotonic(), 0.0  # behind by a second: do not pile up

    def burst(self, count: int) -> None:
        """``count`` messages at once, from the caller's thread."""
        for i in range(count):
            produce_waiting(self.producer, self.topic, value=self.payload, partition=i % self.partitions)
        self.producer.flush(60)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
        self.producer.flush(30)

    def __enter__(self) -> ProduceLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_topic(cluster: Any, topic: str, timeout_s: float = 120.0) -> list[bytes | None]:
    """Every record value of every partition of ``topic`` up to its end offsets now (fails if
    one is short; for a topic that is not compacted)."""
    records = read_records(cluster, topic, timeout_s)
    return [value for *_, value in records]


def read_observations(cluster: Any, telemetry_topic: str) -> list[Any]:
    """Every observation of every telemetry record on ``telemetry_topic`` (records that are
    not telemetry skipped), in offset order per partition."""
    from isrwatch.telemetry import decode_record

    out = []
    for value in read_topic(cluster, telemetry_topic):
        try:
            out.extend(decode_record(value or b"").observations)
        except ValueError:
            continue
    return out


def end_offsets(cluster: Any, topic: str) -> dict[int, int]:
    """Each partition's end offset (high watermark) now: the records a consumer can read."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(cluster.client_config(**{"group.id": f"ends-{topic}", "enable.auto.commit": False}))
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in sorted(md.partitions)}
    finally:
        c.close()


def read_records(
    cluster: Any,
    topic: str,
    timeout_s: float = 120.0,
    *,
    compacted: bool = False,
    ends: dict[int, int] | None = None,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record of ``topic`` up to its end offsets now
    (or up to ``ends``, per partition), in offset order per partition. Unless ``compacted``,
    every offset must be there."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(cluster.client_config(**{"group.id": f"read-{topic}", "enable.auto.commit": False}))
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        deadline = time.monotonic() + timeout_s
        for p in sorted(md.partitions):
            high = (
                ends.get(p, 0) if ends is not None else c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            )
            c.assign([TopicPartition(topic, p, 0)])
            seen, next_offset = 0, 0
            while next_offset < high and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is not None and m.error() is None and m.offset() < high:
                    out.append((p, m.offset(), m.key(), m.value()))
                    seen += 1
                    next_offset = m.offset() + 1
            assert next_offset >= high, f"read up to offset {next_offset} of {high} of {topic}[{p}]"
            assert compacted or seen == high, f"read {seen} of {high} records of {topic}[{p}]"
    finally:
        c.close()
    return out

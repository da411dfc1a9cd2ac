"""The real local Kafka cluster (``localkafka.LocalKafka``) for the benchmarks: a
telemetry topic, a fast producer of pre-encoded records, a plain consumer."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

import isrwatch.logs  # noqa: F401  (lets each librdkafka CONFWARN through once: ConfigWarningsOnce)
from localkafka import COMPAT_CONFIG, LocalKafka

__all__ = ["start_cluster", "new_topic", "producer_config", "produce", "consume_all", "job_source", "BROKER_SETTINGS"]

log = logging.getLogger(__name__)
# the benchmark's own clients log where the job's do, so their CONFWARN lines are printed once
RDLOG = logging.getLogger("librdkafka")

# Records of 500 observations are about 130 kB; room for bigger ones.
# A long ZooKeeper session: a 0.9 broker whose session expires under load can lose
# its partitions leaders for good (new topics then never get one).
BROKER_SETTINGS = {
    "message.max.bytes": 4_000_000,
    "replica.fetch.max.bytes": 4_000_000,
    "num.io.threads": 2,
    "zookeeper.session.timeout.ms": 60_000,
}


def start_cluster(brokers: int = 1) -> LocalKafka:
    """One broker by default: the benchmark measures the job, not Kafka's replication."""
    return LocalKafka(brokers=brokers, broker_settings=BROKER_SETTINGS, heap_mb=512).start()


def new_topic(kafka: LocalKafka, prefix: str, partitions: int = 2) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=partitions, replication_factor=1)
    return name


def producer_config(kafka: LocalKafka, **extra: object) -> dict[str, object]:
    """The benchmarks' producer settings for ``kafka`` (a plain dict: it can go to another process)."""
    return kafka.client_config(
        **{
            "linger.ms": 5,
            "message.max.bytes": 4_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "queue.buffering.max.messages": 100_000,
            **extra,
        }
    )


def producer(kafka: LocalKafka, **extra: object):  # type: ignore[no-untyped-def]
    from confluent_kafka import Producer

    return Producer(producer_config(kafka, **extra), logger=RDLOG)


def produce(kafka: LocalKafka, topic: str, records: Iterable[bytes], key: bytes = b"bench") -> tuple[int, int]:
    """Produce and flush; returns (records, bytes). Partitions round robin."""
    p = producer(kafka)
    failed: list[str] = []

    def report(err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            failed.append(str(err))

    n = size = 0
    parts = len(p.list_topics(topic, timeout=30).topics[topic].partitions)
    for rec in records:
        while True:
            try:
                p.produce(topic, rec, key, partition=n % parts, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        size += len(rec)
        if n % 200 == 0:
            p.poll(0)
    if p.flush(120) != 0 or failed:
        raise RuntimeError(f"producing to {topic} failed: {failed[:3]}")
    return n, size


def consume_all(
    kafka: LocalKafka, topic: str, expected_records: int, timeout_s: float = 600.0
) -> tuple[int, int, float]:
    """The input ceiling: a plain confluent-kafka consumer reading the topic
    from the beginning. Returns (records, bytes, seconds from the first record)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        kafka.client_config(
            **{"group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "enable.partition.eof": False}
        ),
        logger=RDLOG,
    )
    try:
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        n = size = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while n < expected_records and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(m.error().str())
                n += 1
                size += len(m.value() or b"")
        return n, size, time.perf_counter() - t0
    finally:
        c.close()


def job_source(spark: Any, kafka: LocalKafka, topic: str, cap_records: int, state_dir: str | None = None) -> Any:
    """``topic`` through the job's Kafka source (``isrwatch-kafka``) from its earliest offset, at
    most ``cap_records`` records a batch; ``state_dir``: the source's stateDir, as the job sets it."""
    from streaming.sources import source_kafka

    source_kafka.register(spark)
    reader = (
        spark.readStream.format(source_kafka.FORMAT)
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(cap_records))
    )
    if state_dir is not None:
        reader = reader.option("stateDir", state_dir)
    for k, v in COMPAT_CONFIG.items():
        reader = reader.option(f"kafka.{k}", v)
    return reader.load()

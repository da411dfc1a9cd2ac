"""What one read task of the Kafka source does (``streaming.source_kafka``): the records
[start, end) of one topic partition, from a kept consumer, as Arrow batches with the
Kafka source's columns.

Range consumers are kept (unassigned) between reads in a reused Python worker: a
consumer that already knows the partition's leader is not held up by another broker
that hangs. A read whose leader stops answering hands Spark what it has and records
how far it got (``streaming.deferred``), so the rest is read in a later batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from isrwatch.logs import kv
from streaming.deferred import SHORT_READ_NEW_S, SHORT_READ_S, Deferred
from streaming.source_spool import raw_arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaRange", "read_range"]

log = logging.getLogger("streaming.source_kafka")
# librdkafka's own messages (isrwatch.logs holds back its repeats)
rdlog = logging.getLogger("librdkafka")

# Records per Arrow batch handed to Spark.
_ARROW_ROWS = 4096
# Seconds one read() waits for a record before it calls the broker gone. A range is
# planned only from offsets its leader has just reported, so this waits out a leader
# that hangs in the moment between planning and reading (the batch then waits for it)
# rather than failing the query, which would stop the monitor.
_READ_TIMEOUT_S = 300.0
_READ_WARN_S = 15.0
# One consume() call's wait: the short-read check runs between calls.
_CONSUME_S = 0.25
# Range consumers kept between reads in a (reused) Python worker, by configuration
# and partition: a consumer that already knows the partition's leader is not held up
# by another broker that hangs, and requests on one librdkafka handle wait behind
# each other, so a consumer left waiting on a hung leader must never serve another
# partition. Unassigned between reads, so it prefetches nothing.
_RangeKey = tuple[tuple[tuple[str, str], ...], str, int]
_RANGE_CONSUMERS: dict[_RangeKey, Any] = {}


def _range_consumer(config: dict[str, Any], topic: str, partition: int) -> tuple[_RangeKey, Any, bool]:
    """(key, consumer, whether it was kept from an earlier read of the partition)."""
    from confluent_kafka import Consumer

    key = (tuple(sorted((str(k), str(v)) for k, v in config.items())), topic, partition)
    consumer = _RANGE_CONSUMERS.pop(key, None)  # one reader at a time per consumer
    if consumer is not None:
        return key, consumer, True
    consumer = Consumer({**config, "enable.partition.eof": False, "auto.offset.reset": "earliest", "logger": rdlog})
    return key, consumer, False


def _release(key: _RangeKey, consumer: Any, healthy: bool) -> None:
    if healthy and key not in _RANGE_CONSUMERS:
        try:
            consumer.unassign()
            _RANGE_CONSUMERS[key] = consumer
            return
        except Exception:  # noqa: BLE001 - a consumer that cannot unassign is closed instead
            log.debug("range_consumer_unassign_failed", exc_info=True)
    consumer.close()


class KafkaRange(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int, state_dir: str | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        # where a read that cannot reach its leader records how far it got (streaming.deferred)
        self.state_dir = state_dir


def read_range(config: dict[str, Any], r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The records [start, end) of one partition as Arrow batches with the Kafka source's columns."""
    import time

    import pyarrow as pa
    from confluent_kafka import KafkaError, TopicPartition

    schema = raw_arrow_schema()
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    stamps: list[int | None] = []

    def batch() -> pa.RecordBatch:
        n = len(offsets)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([r.topic] * n, pa.string()),
                pa.array([r.partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(stamps, pa.timestamp("us", tz="UTC")),
            ],
            schema=schema,
        )

    key, consumer, kept = _range_consumer(config, r.topic, r.partition)
    short_after = SHORT_READ_S if kept else SHORT_READ_NEW_S
    healthy = False
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        nxt = r.start
        last_progress = time.monotonic()
        warned = 0.0
        deferred = Deferred(r.state_dir) if r.state_dir else None
        short = False
        while nxt < r.end:
            msgs = consumer.consume(num_messages=min(10_000, r.end - nxt), timeout=_CONSUME_S)
            waited = time.monotonic() - last_progress
            if not msgs and deferred is not None and waited > short_after:
                # the leader hangs: hand Spark what was read, the rest goes to a later batch
                deferred.stopped_short((r.topic, r.partition, r.start, r.end), nxt)
                log.warning(kv(event="range_deferred", topic=r.topic, partition=r.partition, read_upto=nxt, end=r.end))
                short = True
                break
            if not msgs and waited > _READ_TIMEOUT_S:
                raise RuntimeError(f"{r.topic}[{r.partition}]: no records past offset {nxt} (want up to {r.end})")
            if not msgs and waited > warned + _READ_WARN_S:
                warned = waited
                log.warning(
                    kv(
                        event="range_read_waiting",
                        topic=r.topic,
                        partition=r.partition,
                        offset=nxt,
                        waited_s=round(waited),
                    )
                )
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"{r.topic}[{r.partition}]: {err.str()}")
                off = int(m.offset() or 0)
                if off < nxt:
                    continue
                if off >= r.end:
                    nxt = r.end
                    break
                last_progress, warned = time.monotonic(), 0.0
                ts_type, ts = m.timestamp()
                keys.append(m.key())
                values.append(m.value())
                offsets.append(off)
                stamps.append(ts * 1000 if ts_type != 0 and ts >= 0 else None)
                nxt = off + 1
                if len(offsets) >= _ARROW_ROWS:
                    yield batch()
                    keys, values, offsets, stamps = [], [], [], []
        if offsets:
            yield batch()
        if deferred is not None and not short:
            deferred.read_whole((r.topic, r.partition, r.start, r.end))
        healthy = not short
    finally:
        _release(key, consumer, healthy)
    log.debug(kv(event="range_read", topic=r.topic, partition=r.partition, start=r.start, end=r.end))

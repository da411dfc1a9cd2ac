"""What one read task of the Kafka source does (``streaming.sources.source_kafka``): the records
[start, end) of one topic partition, from a kept consumer, as Arrow batches with the
Kafka source's columns.

Range consumers are kept (unassigned) between reads in a reused Python worker: a
consumer that already knows the partition's leader is not held up by another broker
that hangs. A read whose leader stops answering hands Spark what it has and records
how far it got (``streaming.sources.deferred``), so the rest is read in a later batch.

A range can be read more than once in its batch (two executors computing the same
partition, a lost executor's partitions): the first read to finish decides how far
the batch reads it (``Deferred.decide``), and every read hands Spark exactly the
records up to there. A read that learns of an earlier decision short of what it
has already handed Spark fails its task, and Spark's retry reads as decided.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from isrwatch.logs import kv
from streaming.sources.deferred import SHORT_READ_NEW_S, SHORT_READ_S, Deferred
from streaming.sources.source_spool import raw_arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer

__all__ = ["KafkaRange", "ConsumerConfig", "read_range", "close_kept_consumers"]

# librdkafka settings of a consumer (streaming.sources.source_kafka.consumer_config)
ConsumerConfig = dict[str, str | int | bool]

log = logging.getLogger("streaming.source_kafka")
# librdkafka's own messages (isrwatch.logs holds back its repeats)
rdlog = logging.getLogger("librdkafka")

# Records per Arrow batch handed to Spark, and the bytes of their keys and values: a batch is
# handed over at whichever comes first. Records of ~1 MB (bad records, a producer writing big
# ones to the topic) made batches of up to 4 GB: 600 of 900 KB ran a 1 GiB JVM out of memory.
_ARROW_ROWS = 4096
_ARROW_BYTES = 16 << 20
# Seconds one read() waits for a record before it calls the broker gone. A range is
# planned only from offsets its leader has just reported, so this waits out a leader
# that hangs in the moment between planning and reading (the batch then waits for it)
# rather than failing the query, which would stop the monitor.
_READ_TIMEOUT_S = 300.0
# Seconds a read that must reach where another read of its range got to (the batch has
# those records already) waits for its leader. Then its task fails: after Spark's retries
# the batch fails, the job restarts its query, and the replay, deciding afresh, defers
# what the hung leader holds; a leader that hangs past this no longer holds the job.
_DECIDED_WAIT_S = 30.0
_READ_WARN_S = 15.0
# One consume() call's wait: the short-read check runs between calls.
_CONSUME_S = 0.25
# Range consumers kept between reads in a (reused) Python worker, by configuration
# and partition: a consumer that already knows the partition's leader is not held up
# by another broker that hangs, and requests on one librdkafka handle wait behind
# each other, so a consumer left waiting on a hung leader must never serve another
# partition. Unassigned between reads, so it prefetches nothing.
_RangeKey = tuple[tuple[tuple[str, str], ...], str, int]
_RANGE_CONSUMERS: dict[_RangeKey, Consumer] = {}


def _range_consumer(config: ConsumerConfig, topic: str, partition: int) -> tuple[_RangeKey, Consumer, bool]:
    """(key, consumer, whether it was kept from an earlier read of the partition)."""
    from confluent_kafka import Consumer

    key = (tuple(sorted((str(k), str(v)) for k, v in config.items())), topic, partition)
    consumer = _RANGE_CONSUMERS.pop(key, None)  # one reader at a time per consumer
    if consumer is not None:
        return key, consumer, True
    consumer = Consumer({**config, "enable.partition.eof": False, "auto.offset.reset": "earliest", "logger": rdlog})
    return key, consumer, False


def _release(key: _RangeKey, consumer: Consumer, healthy: bool) -> None:
    if healthy and key not in _RANGE_CONSUMERS:
        try:
            consumer.unassign()
            _RANGE_CONSUMERS[key] = consumer
            return
        except Exception:  # noqa: BLE001 - a consumer that cannot unassign is closed instead
            log.debug("range_consumer_unassign_failed", exc_info=True)
    consumer.close()


def close_kept_consumers() -> None:
    """Close the consumers kept between reads in this process (a test's end; a Spark Python
    worker's go with the worker)."""
    while _RANGE_CONSUMERS:
        _, consumer = _RANGE_CONSUMERS.popitem()
        consumer.close()


class KafkaRange(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark task."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        state_dir: str | None = None,
        plan: str | None = None,
    ) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        # where a read that cannot reach its leader records how far it got (streaming.sources.deferred),
        # and the batch's name there (deferred.plan_id): both or neither
        self.state_dir = state_dir
        self.plan = plan

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.topic, self.partition, self.start, self.end)


class _Read:
    """One read of a range: the records read and not yet handed to Spark, and how far
    the batch reads the range (``upto``: the range's end until a read decides)."""

    def __init__(self, r: KafkaRange, deferred: Deferred | None) -> None:
        self.r = r
        self.deferred = deferred
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.bytes = 0  # of the keys and values held
        self.nxt = r.start  # the next offset to read
        self.handed = r.start  # the records before this offset are with Spark
        found = deferred.decided(r.plan, r.key) if deferred is not None and r.plan else None
        self.decided = found is not None  # by an earlier read: read exactly that far, however long it takes
        self.upto = r.end if found is None else found

    def add(self, offset: int, key: bytes | None, value: bytes | None, stamp: int | None) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.stamps.append(stamp)
        self.bytes += len(key or b"") + len(value or b"")
        self.nxt = offset + 1

    @property
    def full(self) -> bool:
        """Enough held to hand Spark an Arrow batch (``_ARROW_ROWS`` records or ``_ARROW_BYTES``)."""
        return len(self.offsets) >= _ARROW_ROWS or self.bytes >= _ARROW_BYTES

    def take(self) -> pa.RecordBatch:
        """The records held, as an Arrow batch with the Kafka source's columns (handed to Spark)."""
        import pyarrow as pa

        n = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.r.topic] * n, pa.string()),
                pa.array([self.r.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.stamps, pa.timestamp("us", tz="UTC")),
            ],
            schema=raw_arrow_schema(),
        )
        self.keys, self.values, self.offsets, self.stamps = [], [], [], []
        self.bytes = 0
        self.handed = self.nxt
        return batch

    def decide(self, upto: int) -> None:
        """The batch reads the range up to ``upto``, unless a read of it decided first: then
        as far as that one (``Deferred.decide``)."""
        assert self.deferred is not None and self.r.plan is not None
        self._follow(self.deferred.decide(self.r.plan, self.r.key, upto))

    def check(self) -> None:
        """Before handing Spark more: follow a decision another read has made meanwhile."""
        if self.deferred is not None and self.r.plan and not self.decided:
            found = self.deferred.decided(self.r.plan, self.r.key)
            if found is not None:
                self._follow(found)

    def _follow(self, upto: int) -> None:
        self.decided, self.upto = True, upto
        if upto >= self.nxt:
            return  # read on up to there (another read got further)
        if upto < self.handed:
            raise RuntimeError(
                f"{self.r.topic}[{self.r.partition}]: this read handed Spark records up to offset {self.handed}, "
                f"another read of [{self.r.start}, {self.r.end}) in the batch stopped at {upto}: "
                "the task fails and Spark's retry reads as far as that one"
            )
        keep = bisect.bisect_left(self.offsets, upto)
        del self.keys[keep:], self.values[keep:], self.offsets[keep:], self.stamps[keep:]
        self.bytes = sum(len(k or b"") + len(v or b"") for k, v in zip(self.keys, self.values, strict=True))
        self.nxt = upto


def read_range(config: ConsumerConfig, r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The records [start, end) of one partition as Arrow batches with the Kafka source's
    columns; with a state directory, up to where the batch's first read of it stopped."""
    import time

    from confluent_kafka import KafkaError, TopicPartition

    key, consumer, kept = _range_consumer(config, r.topic, r.partition)
    short_after = SHORT_READ_S if kept else SHORT_READ_NEW_S
    stalled = healthy = False  # kept for the next read only when it ends well and its leader answered
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        read = _Read(r, Deferred(r.state_dir) if r.state_dir and r.plan else None)
        last_progress = time.monotonic()
        warned = 0.0
        while read.nxt < read.upto:
            msgs = consumer.consume(num_messages=min(10_000, read.upto - read.nxt), timeout=_CONSUME_S)
            waited = time.monotonic() - last_progress
            if not msgs and read.deferred is not None and not read.decided and waited > short_after:
                # the leader hangs: hand Spark what was read, the rest goes to a later batch
                # (unless another read of the range decided first: then as far as that one)
                stalled = True
                read.decide(read.nxt)
                if read.upto < r.end:
                    log.warning(
                        kv(event="range_deferred", topic=r.topic, partition=r.partition, read_upto=read.upto, end=r.end)
                    )
                continue
            if not msgs and read.deferred is not None and read.decided and waited > _DECIDED_WAIT_S:
                raise RuntimeError(
                    f"{r.topic}[{r.partition}]: no records past offset {read.nxt} in {_DECIDED_WAIT_S:g} s; another "
                    f"read of the range in this batch got to {read.upto}: the task fails (a replay decides afresh)"
                )
            if not msgs and waited > _READ_TIMEOUT_S:
                raise RuntimeError(
                    f"{r.topic}[{r.partition}]: no records past offset {read.nxt} (want up to {read.upto})"
                )
            if not msgs and waited > warned + _READ_WARN_S:
                warned = waited
                log.warning(
                    kv(
                        event="range_read_waiting",
                        topic=r.topic,
                        partition=r.partition,
                        offset=read.nxt,
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
                if off < read.nxt:
                    continue
                if off >= read.upto:
                    read.nxt = read.upto
                    break
                last_progress, warned = time.monotonic(), 0.0
                ts_type, ts = m.timestamp()
                read.add(off, m.key(), m.value(), ts * 1000 if ts_type != 0 and ts >= 0 else None)
                if read.full:
                    read.check()
                    if read.offsets:
                        yield read.take()
        if read.deferred is not None and not read.decided:
            read.decide(read.nxt)  # read whole (or as far as a read that decided meanwhile)
        if read.offsets:
            yield read.take()
        healthy = not stalled
    finally:
        _release(key, consumer, healthy)
    log.debug(kv(event="range_read", topic=r.topic, partition=r.partition, start=r.start, end=r.end, upto=read.upto))

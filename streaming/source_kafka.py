"""The job's Kafka source: a PySpark Python streaming data source backed by confluent-kafka.

Format name ``isrwatch-kafka``. Options are named like Spark's own Kafka
source, so ``format("kafka")`` can replace it where the connector jar exists:

* ``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated topics),
* ``startingOffsets``: ``earliest`` or ``latest`` (default) for a new checkpoint,
* ``maxOffsetsPerTrigger``: most records per micro-batch, over all partitions,
* ``stateDir`` (isrwatch's own): where a read task that cannot reach its leader
  records how far it got, so the rest is read in a later batch instead of
  holding this one (``streaming.deferred``); without it such a read waits,
* ``partitionAnswerMs`` (isrwatch's own): how long planning a micro-batch waits
  for each partition's leader; a partition whose leader has not answered keeps
  its last known end offset, so a hung broker never holds a batch
  (``streaming.watermarks``),
* every other ``kafka.<property>`` goes to the consumer as ``<property>``
  (librdkafka names: ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ...).

Offsets are Spark's Kafka offset JSON, ``{"topic": {"0": 123}}`` (the next
offset to read per partition), checkpointed by Spark: a restarted query resumes
exactly where its checkpoint stopped. ``read`` assigns each partition range to
a consumer and hands Spark Arrow record batches with the Kafka source's
columns (key, value, topic, partition, offset, timestamp): raw bytes, parsed
by Spark in the JVM, not here.

Range consumers are kept (unassigned) between reads in a reused Python worker,
and librdkafka's ``socket.timeout.ms`` defaults to 10 s here: a broker that
hangs without closing its connections (SIGSTOP, swapping) must not stall the
telemetry for a minute and fail the query.

Python's data source API has no admission control before Spark 4.2, so the
reader caps ``latestOffset`` itself, from the end of the last range Spark
planned (``partitions`` tells a restarted reader where its checkpoint was).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from isrwatch.logs import kv
from streaming.deferred import SHORT_READ_S, Deferred
from streaming.source_spool import RAW_SCHEMA
from streaming.watermarks import Watermarks

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT",
    "KafkaDataSource",
    "KafkaStreamReader",
    "KafkaRange",
    "register",
    "cap_offsets",
    "consumer_config",
    "describe_topic",
]

log = logging.getLogger(__name__)
# librdkafka's own messages (isrwatch.logs holds back its repeats)
rdlog = logging.getLogger("librdkafka")

FORMAT = "isrwatch-kafka"

Offsets = dict[str, dict[str, int]]

# Records per Arrow batch handed to Spark.
_ARROW_ROWS = 4096
# Seconds one read() waits for a record before it calls the broker gone. A range is
# planned only from offsets its leader has just reported, so this waits out a leader
# that hangs in the moment between planning and reading (the batch then waits for it)
# rather than failing the query, which would stop the monitor.
_READ_TIMEOUT_S = 300.0
_READ_WARN_S = 15.0
_SOCKET_TIMEOUT_MS = "10000"
# How long planning a micro-batch waits for each partition's leader (option partitionAnswerMs).
_ANSWER_MS = 1000
_FIRST_ANSWER_S = 10.0

# Range consumers kept between reads in a (reused) Python worker, by configuration
# and partition: a consumer that already knows the partition's leader is not held up
# by another broker that hangs, and requests on one librdkafka handle wait behind
# each other, so a consumer left waiting on a hung leader must never serve another
# partition. Unassigned between reads, so it prefetches nothing.
_RangeKey = tuple[tuple[tuple[str, str], ...], str, int]
_RANGE_CONSUMERS: dict[_RangeKey, Any] = {}


def _range_consumer(config: dict[str, Any], topic: str, partition: int) -> tuple[_RangeKey, Any]:
    from confluent_kafka import Consumer

    key = (tuple(sorted((str(k), str(v)) for k, v in config.items())), topic, partition)
    consumer = _RANGE_CONSUMERS.pop(key, None)  # one reader at a time per consumer
    if consumer is None:
        consumer = Consumer({**config, "enable.partition.eof": False, "auto.offset.reset": "earliest", "logger": rdlog})
    return key, consumer


def _release(key: _RangeKey, consumer: Any, healthy: bool) -> None:
    if healthy and key not in _RANGE_CONSUMERS:
        try:
            consumer.unassign()
            _RANGE_CONSUMERS[key] = consumer
            return
        except Exception:  # noqa: BLE001 - a consumer that cannot unassign is closed instead
            log.debug("range_consumer_unassign_failed", exc_info=True)
    consumer.close()


def consumer_config(options: dict[str, str]) -> dict[str, Any]:
    """librdkafka settings from the ``kafka.*`` options (prefix dropped)."""
    cfg: dict[str, Any] = {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    if "bootstrap.servers" not in cfg:
        raise ValueError("option kafka.bootstrap.servers is required")
    cfg.setdefault("group.id", "isrwatch-source")  # never joins nor commits: partitions are assigned
    # A hung broker (paused, swapping) accepts connections but never answers: with
    # librdkafka's 60 s default, a consumer whose first metadata request went there
    # read nothing for a minute. Give up on it sooner and ask another broker.
    cfg.setdefault("socket.timeout.ms", _SOCKET_TIMEOUT_MS)
    cfg["enable.auto.commit"] = False
    cfg["enable.partition.eof"] = True
    return cfg


def cap_offsets(start: Offsets, latest: Offsets, limit: int | None) -> Offsets:
    """``latest``, held to at most ``limit`` records past ``start`` in total, shared in proportion to each partition's backlog."""
    avail = {(t, p): max(0, hi - start.get(t, {}).get(p, hi)) for t, parts in latest.items() for p, hi in parts.items()}
    total = sum(avail.values())
    out: Offsets = {t: dict(parts) for t, parts in latest.items()}
    if limit is None or total <= limit:
        return out
    shares = {k: limit * n / total for k, n in avail.items()}
    take = {k: int(s) for k, s in shares.items()}
    left = limit - sum(take.values())
    for k in sorted(shares, key=lambda k: shares[k] - take[k], reverse=True)[:left]:
        take[k] += 1
    for (t, p), n in take.items():
        out[t][p] = start[t][p] + n if p in start.get(t, {}) else latest[t][p]
    return out


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


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        lower = {k.lower(): v for k, v in options.items()}
        self.config = consumer_config(options)
        topics = [t.strip() for t in lower.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("option subscribe is required (comma-separated topic names)")
        self.topics = topics
        self.starting = lower.get("startingoffsets", "latest").strip().lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError(f"option startingOffsets={self.starting!r}: use earliest or latest")
        # maxRecordsPerTrigger: the spool source's name for the same cap, accepted too.
        cap = lower.get("maxoffsetspertrigger") or lower.get("maxrecordspertrigger")
        self.max_offsets = int(cap) if cap else None
        if self.max_offsets is not None and self.max_offsets < 1:
            raise ValueError(f"option maxOffsetsPerTrigger={cap}: must be at least 1")
        answer = lower.get("partitionanswerms", str(_ANSWER_MS))
        try:
            self.answer_s = int(answer) / 1000
        except ValueError:
            raise ValueError(f"option partitionAnswerMs={answer!r}: a whole number of milliseconds") from None
        if self.answer_s <= 0:
            raise ValueError(f"option partitionAnswerMs={answer}: must be at least 1")
        self._marks: Watermarks | None = None
        self.state_dir = lower.get("statedir") or None
        self._commits = 0
        self._owed: set[str] = set()
        # End of the last range Spark planned or committed, per partition.
        self._planned: Offsets = {}
        # Where partitions first seen after the start begin.
        self._first: Offsets = {}
        self._started = False

    # The driver's watermark questions (threads, a consumer) are not shipped to the tasks.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_marks"] = None
        return state

    def _meta_consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({**self.config, "logger": rdlog})

    def _watermarks(self, wait_s: float | None = None) -> tuple[Offsets, Offsets]:
        """(low, high) watermarks of the partitions whose leaders answer (streaming.watermarks)."""
        if self._marks is None:
            self._marks = Watermarks(self._meta_consumer, self.topics, self.answer_s)
        return self._marks.poll(wait_s)

    def initialOffset(self) -> Offsets:
        # the first questions also connect: give them longer than a batch's planning
        low, high = self._watermarks(max(self.answer_s, _FIRST_ANSWER_S))
        start = low if self.starting == "earliest" else high
        self._planned = {t: dict(ps) for t, ps in start.items()}
        self._started = True
        return start

    def latestOffset(self) -> Offsets:
        low, high = self._watermarks()
        if not self._planned:
            self._planned = {t: dict(ps) for t, ps in (low if self.starting == "earliest" else high).items()}
        base: Offsets = {t: dict(ps) for t, ps in self._planned.items()}
        for t, parts in high.items():
            for p in parts:
                if p in base.get(t, {}):
                    continue
                # First answer of a partition: one created since the job started is read from
                # its beginning; one that only answered late starts where startingOffsets says.
                first = high[t][p] if self._started and self.starting == "latest" else low[t][p]
                base.setdefault(t, {})[p] = first
                self._first.setdefault(t, {})[p] = first
        # A partition whose leader did not answer this time is not read from, even up to
        # an end it reported before: reading needs that leader too, and would hold the batch.
        assert self._marks is not None
        for late_topic, late_partition in self._marks.late:
            key = str(late_partition)
            if key in high.get(late_topic, {}) and key in base.get(late_topic, {}):
                high[late_topic][key] = base[late_topic][key]
        end = cap_offsets(base, high, self.max_offsets)
        # never behind what was planned already (a partition whose leader is late keeps its offsets)
        for t, parts in base.items():
            for p, off in parts.items():
                end.setdefault(t, {})[p] = max(end.get(t, {}).get(p, off), off)
        return end

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        for t, parts in end.items():
            for p, hi in parts.items():
                cur = self._planned.setdefault(t, {}).get(p)
                self._planned[t][p] = hi if cur is None else max(cur, hi)
        if self.state_dir is None:
            ranges = []
            for t, parts in end.items():
                for p, hi in parts.items():
                    # a partition new in this batch: from where its first answer put it
                    lo = int(start.get(t, {}).get(p, self._first.get(t, {}).get(p, 0)))
                    if hi > lo:
                        ranges.append(KafkaRange(t, int(p), lo, int(hi)))
            return ranges
        late = set(self._marks.late) if self._marks is not None else set()
        planned, owed = Deferred(self.state_dir).plan(start, end, late, self._first)
        if set(owed) != self._owed:
            self._owed = set(owed)
            owing = ",".join(f"{k}@{o}" for k, o in sorted(owed.items())) or "none"
            log.warning(kv(event="telemetry_ranges_owed", partitions=owing))
        return [KafkaRange(t, p, lo, hi, self.state_dir) for t, p, lo, hi in planned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        yield from read_range(self.config, partition)

    def commit(self, end: Offsets) -> None:
        self._commits += 1
        if self.state_dir is not None and self._commits % 500 == 0:
            Deferred(self.state_dir).tidy()
        for t, parts in end.items():
            for p, off in parts.items():
                cur = self._planned.setdefault(t, {}).get(p)
                self._planned[t][p] = off if cur is None else max(cur, off)

    def stop(self) -> None:
        if self._marks is not None:
            self._marks.close()
            self._marks = None


def read_range(config: dict[str, Any], r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The records [start, end) of one partition as Arrow batches with the Kafka source's columns."""
    import time

    import pyarrow as pa
    from confluent_kafka import KafkaError, TopicPartition

    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
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

    key, consumer = _range_consumer(config, r.topic, r.partition)
    healthy = False
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        nxt = r.start
        last_progress = time.monotonic()
        warned = 0.0
        deferred = Deferred(r.state_dir) if r.state_dir else None
        short = False
        while nxt < r.end:
            msgs = consumer.consume(num_messages=min(10_000, r.end - nxt), timeout=1.0)
            waited = time.monotonic() - last_progress
            if not msgs and deferred is not None and waited > SHORT_READ_S:
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


class KafkaDataSource(DataSource):
    """``spark.readStream.format("isrwatch-kafka").option("kafka.bootstrap.servers", H).option("subscribe", T).load()``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return RAW_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("isrwatch-kafka")`` available in this session."""
    spark.dataSource.register(KafkaDataSource)


def describe_topic(options: dict[str, str], topic: str, timeout_s: float) -> tuple[str | None, Offsets, Offsets]:
    """(cluster id, low, high watermarks) of ``topic`` at start-up, for ``streaming.origin``.

    UnreachableError when no broker answers within ``timeout_s``; partitions
    whose leader does not answer in time are left out.
    """
    from confluent_kafka import Consumer, KafkaException

    from isrwatch.exceptions import UnreachableError

    config = consumer_config(options)
    consumer = Consumer({**config, "logger": rdlog})
    try:
        md = consumer.list_topics(timeout=timeout_s)
    except KafkaException as e:
        consumer.close()
        raise UnreachableError(
            f"cannot reach Kafka at {config['bootstrap.servers']}: {e.args[0].str() if e.args else e}"
        ) from None
    cluster_id = md.cluster_id or None
    tmd = md.topics.get(topic)
    consumer.close()
    if tmd is None or tmd.error is not None:
        log.warning(
            kv(event="telemetry_topic_missing", topic=topic, hint="the job reads it once the collector creates it")
        )
        return cluster_id, {}, {}
    if len(tmd.partitions) == 1:
        log.warning(
            kv(
                event="telemetry_topic_single_partition",
                topic=topic,
                hint="when its leader stalls the job sees no telemetry; give it one partition per broker or more",
            )
        )
    marks = Watermarks(lambda: Consumer({**config, "logger": rdlog}), [topic], answer_s=min(timeout_s, 5.0))
    try:
        low, high = marks.poll()
    finally:
        marks.close()
    return cluster_id, low, high

"""The job's Kafka source: a PySpark Python streaming data source backed by confluent-kafka.

Format name ``isrwatch-kafka``. Options are named like Spark's own Kafka
source, so ``format("kafka")`` can replace it where the connector jar exists:

* ``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated topics),
* ``startingOffsets``: ``earliest`` or ``latest`` (default) for a new checkpoint,
* ``maxOffsetsPerTrigger``: most records per micro-batch, over all partitions,
* ``stateDir`` (isrwatch's own): where a read task that cannot reach its leader
  records how far it got, so the rest is read in a later batch instead of
  holding this one (``streaming.sources.deferred``); without it such a read waits,
* ``partitionAnswerMs`` (isrwatch's own): how long planning a micro-batch waits
  for each partition's leader; a partition whose leader has not answered keeps
  its last known end offset, so a hung broker never holds a batch
  (``streaming.sources.watermarks``),
* every other ``kafka.<property>`` goes to the consumer as ``<property>``
  (librdkafka names: ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ...).

Offsets are Spark's Kafka offset JSON, ``{"topic": {"0": 123}}`` (the next
offset to read per partition), checkpointed by Spark: a restarted query resumes
exactly where its checkpoint stopped. A partition whose end stays below the job's
position (its log cut back, its topic created again) is read again from its new end
(``KafkaStreamReader._go_back``), the one time the offsets go back. Each partition range is one task
(``streaming.sources.range_read``: a kept consumer hands Spark Arrow record batches with
the Kafka source's columns, raw bytes, parsed by Spark in the JVM, not here).

librdkafka's ``socket.timeout.ms`` defaults to 10 s here: a broker that
hangs without closing its connections (SIGSTOP, swapping) must not stall the
telemetry for a minute and fail the query.

Python's data source API has no admission control before Spark 4.2, so the
reader caps ``latestOffset`` itself, from the end of the last range Spark
planned (``partitions`` tells a restarted reader where its checkpoint was).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from isrwatch.logs import kv, worker_logging
from streaming.sources.deferred import Deferred, plan_id
from streaming.sources.range_read import ConsumerConfig, KafkaRange, read_range
from streaming.sources.source_spool import RAW_SCHEMA
from streaming.sources.watermarks import Watermarks

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

log = logging.getLogger("streaming.source_kafka")
# librdkafka's own messages (isrwatch.logs holds back its repeats)
rdlog = logging.getLogger("librdkafka")

FORMAT = "isrwatch-kafka"

Offsets = dict[str, dict[str, int]]

_SOCKET_TIMEOUT_MS = "10000"
# How long planning a micro-batch waits for each partition's leader (option partitionAnswerMs).
_ANSWER_MS = 1000
_FIRST_ANSWER_S = 10.0
# How long a partition's end stays behind the job's position before the job reads it from there
# (a new leader's high watermark can trail the old one's for a moment after a clean election).
GO_BACK_AFTER_S = 10.0


def consumer_config(options: dict[str, str]) -> ConsumerConfig:
    """librdkafka settings from the ``kafka.*`` options (prefix dropped)."""
    cfg: ConsumerConfig = {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}
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


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        worker_logging()  # made in the process Spark starts to plan the source's batches
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
        # The batch whose reads this reader has started afresh (Deferred.forget_reads).
        self._reads_of: str | None = None
        # End of the last range Spark planned or committed, per partition.
        self._planned: Offsets = {}
        # Where partitions first seen after the start begin.
        self._first: Offsets = {}
        # Partitions whose end offset is behind _planned (_go_back): since when (monotonic), and
        # the lowest end seen since.
        self._behind: dict[tuple[str, str], tuple[float, int]] = {}
        # Partitions planned back (_go_back), until the batch that reads them from there
        # commits: where that batch reads them from, and where the job was before.
        self._back: dict[tuple[str, str], tuple[int, int]] = {}
        self._started = False

    # The driver's watermark questions (threads, connections) are not shipped to the tasks.
    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_marks"] = None
        return state

    def _watermarks(self, wait_s: float | None = None) -> tuple[Offsets, Offsets]:
        """(low, high) watermarks of the partitions whose leaders answer (streaming.sources.watermarks)."""
        if self._marks is None:
            self._marks = Watermarks(self.config, self.topics, self.answer_s)
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
        self._go_back(base, high)
        # A partition whose leader did not answer this time is not read from, even up to
        # an end it reported before: reading needs that leader too, and would hold the batch.
        assert self._marks is not None
        for late_topic, late_partition in self._marks.late:
            key = str(late_partition)
            if key in high.get(late_topic, {}) and key in base.get(late_topic, {}):
                high[late_topic][key] = base[late_topic][key]
        end = cap_offsets(self._owed_from(base), high, self.max_offsets)
        if end != high and all(end.get(t, {}).get(p, off) <= off for t, ps in base.items() for p, off in ps.items()):
            # what is owed fills the cap: one record more, so that Spark runs the batch that reads it
            end = cap_offsets(base, high, 1)
        # never behind what was planned already (a partition whose leader is late keeps its offsets)
        for t, parts in base.items():
            for p, off in parts.items():
                end.setdefault(t, {})[p] = max(end.get(t, {}).get(p, off), off)
        return end

    def _owed_from(self, base: Offsets) -> Offsets:
        """``base``, each partition that the batch before left unread (a short read,
        ``streaming.sources.deferred``) from where it stopped: the next batch reads that too,
        so it counts toward the cap. (Not counted, a batch after a short read of a whole batch
        planned twice the cap: measured, a backlog's batch after an empty one ran the job's JVM
        out of heap, docs/kafka.md.) A partition whose leader is late keeps owing: not counted."""
        if self.state_dir is None:
            return base
        late = set(self._marks.late) if self._marks is not None else set()
        counted = {t: dict(parts) for t, parts in base.items()}
        for key, offset in Deferred(self.state_dir).owed(base).items():
            t, _, p = key.rpartition("/")
            if p in counted.get(t, {}) and (t, int(p)) not in late:
                counted[t][p] = min(counted[t][p], int(offset))
        return counted

    def _go_back(self, planned: Offsets, high: Offsets) -> None:
        """Read a partition again from its new end when that end has stayed behind where the job
        reads it from for ``GO_BACK_AFTER_S``: its log cut back (an unclean leader election) or
        its topic deleted and created again. Without it the job would read nothing there until
        the end passed its old position, and never what was written meanwhile. It goes back to
        the lowest end seen while behind (``planned`` and the reader's plan lowered): what the
        new log held before that, written before the job first saw it, is lost, and said.
        (A new leader's high watermark behind the old one's for less than the grace, until its
        followers fetch again, is waited out: going back then would read records twice.)"""
        late = set(self._marks.late) if self._marks is not None else set()
        now = time.monotonic()
        behind = {
            (t, p): hi
            for t, parts in high.items()
            for p, hi in parts.items()
            if p in planned.get(t, {}) and hi < planned[t][p] and (t, int(p)) not in late
        }
        for key in set(self._behind) - set(behind):
            del self._behind[key]
        for (t, p), hi in sorted(behind.items()):
            since, lowest = self._behind.get((t, p), (now, hi))
            lowest = min(lowest, hi)
            if now - since < GO_BACK_AFTER_S:
                self._behind[(t, p)] = (since, lowest)
                continue
            self._behind.pop((t, p), None)
            was = planned[t][p]
            log.warning(
                kv(
                    event="telemetry_offsets_went_back",
                    topic=t,
                    partition=p,
                    reading_from=was,
                    end=hi,
                    now_reading_from=lowest,
                    hint="the partition's log was cut back or its topic created again; "
                    "what it held below the new position is not read",
                )
            )
            self._back[(t, p)] = (lowest, was)
            planned[t][p] = self._planned[t][p] = lowest

    def _backs(self, start: Offsets, end: Offsets) -> dict[str, int]:
        """The partitions this batch reads from where ``_go_back`` put them (its end before its
        start): ``"topic/partition" -> offset``."""
        return {
            f"{t}/{p}": lo
            for (t, p), (lo, _) in self._back.items()
            if p in end.get(t, {}) and int(end[t][p]) < int(start.get(t, {}).get(p, 0))
        }

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        for t, parts in end.items():
            for p, hi in parts.items():
                cur = self._planned.setdefault(t, {}).get(p)
                self._planned[t][p] = hi if cur is None else max(cur, hi)
        back = self._backs(start, end)
        if self.state_dir is None:
            ranges = []
            for t, parts in end.items():
                for p, hi in parts.items():
                    # a partition new in this batch: from where its first answer put it
                    lo = int(start.get(t, {}).get(p, self._first.get(t, {}).get(p, 0)))
                    lo = back.get(f"{t}/{p}", lo)
                    if hi > lo:
                        ranges.append(KafkaRange(t, int(p), lo, int(hi)))
            return ranges
        late = set(self._marks.late) if self._marks is not None else set()
        planned, owed = Deferred(self.state_dir).plan(start, end, late, self._first, back)
        if set(owed) != self._owed:
            self._owed = set(owed)
            owing = ",".join(f"{k}@{o}" for k, o in sorted(owed.items())) or "none"
            log.warning(kv(event="telemetry_ranges_owed", partitions=owing))
        # Every read of a range in this run of the batch reads it as far as the first read that
        # finished; what a run of it before a restart read was never committed: forgotten.
        batch = plan_id(start, end)
        if batch != self._reads_of:
            Deferred(self.state_dir).forget_reads(batch)
            self._reads_of = batch
        return [KafkaRange(t, p, lo, hi, self.state_dir, batch) for t, p, lo, hi in planned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        worker_logging()  # an executor's Python worker
        yield from read_range(self.config, partition)

    def commit(self, end: Offsets) -> None:
        self._commits += 1
        if self.state_dir is not None and self._commits % 500 == 0:
            Deferred(self.state_dir).tidy()
        for t, parts in end.items():
            for p, off in parts.items():
                back = self._back.get((t, p))
                if back is not None:
                    if off >= back[1]:
                        continue  # a batch from before the partition went back (Spark commits late)
                    del self._back[(t, p)]
                cur = self._planned.setdefault(t, {}).get(p)
                self._planned[t][p] = off if cur is None else max(cur, off)

    def stop(self) -> None:
        if self._marks is not None:
            self._marks.close()
            self._marks = None


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
    """(cluster id, low, high watermarks) of ``topic`` at start-up, for ``streaming.lifecycle.origin``.

    UnreachableError when no broker answers within ``timeout_s``; partitions
    whose leader does not answer in time are left out.
    """
    from confluent_kafka import KafkaException

    from exporter.kafka_metadata import first_metadata
    from isrwatch.exceptions import UnreachableError

    config = consumer_config(options)
    try:
        md = first_metadata(config, timeout_s)  # a hung broker among them must not fail the start
    except KafkaException as e:
        raise UnreachableError(
            f"cannot reach Kafka at {config['bootstrap.servers']}: {e.args[0].str() if e.args else e}"
        ) from None
    cluster_id = md.cluster_id or None
    tmd = md.topics.get(topic)
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
    marks = Watermarks(config, [topic], answer_s=min(timeout_s, 5.0))
    try:
        low, high = marks.poll()
    finally:
        marks.close()
    return cluster_id, low, high

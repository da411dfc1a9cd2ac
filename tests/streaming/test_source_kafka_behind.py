"""The isrwatch-kafka source's reader when a partition's end falls behind where it reads from.

A telemetry partition's log cut back (an unclean leader election) or its topic deleted and
created again leaves the partition's end offset below the job's position. Once that has
lasted ``GO_BACK_AFTER_S`` the reader says so (``telemetry_offsets_went_back``) and reads the
partition from the lowest end it saw meanwhile, so what is written there from then on reaches
the job; before, the job read nothing there until the end passed its old position.

The real-Kafka test drives the reader as Spark's micro-batch loop does, without Spark: the
end offsets, then the commit of the batch *before* (Spark commits a batch's offsets to its
source only once the next batch is planned), then the ranges, each read. The session's shared
cluster: a topic of this test's own is deleted and created again. The unit tests give the
reader planned answers for what real Kafka cannot be made to do on cue (a new leader's
trailing high watermark).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from localkafka import COMPAT_CONFIG
from streaming.sources import source_kafka
from streaming.sources.range_read import close_kept_consumers
from streaming.sources.source_kafka import GO_BACK_AFTER_S, KafkaStreamReader

Offsets = dict[str, dict[str, int]]


def _said(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event} " in r.getMessage()]


class Loop:
    """Spark's micro-batch loop over one reader: ``batch()`` plans the next batch, commits the
    one before, and reads the new batch's ranges (the records' values, in order)."""

    def __init__(self, reader: KafkaStreamReader, read: bool = True) -> None:
        self.reader = reader
        self.read = read
        self.start: Offsets = reader.initialOffset()
        self.committed: Offsets | None = None

    def batch(self) -> list[bytes]:
        end = self.reader.latestOffset()
        if end == self.start:
            return []  # Spark runs no batch
        if self.committed is not None:
            self.reader.commit(self.committed)
        values: list[bytes] = []
        for r in self.reader.partitions(self.start, end):
            if self.read:
                for b in self.reader.read(r):
                    values += b.column("value").to_pylist()
        self.committed, self.start = end, end
        return values


def _produce(cluster, topic: str, prefix: str, n: int) -> None:
    p = Producer(cluster.client_config(acks="all"))
    for i in range(n):
        p.produce(topic, value=f"{prefix}{i}".encode(), partition=0)
    assert p.flush(30) == 0


@pytest.mark.kafka
@pytest.mark.parametrize("deferring", [True, False], ids=["state-dir", "no-state-dir"])
def test_a_partition_whose_end_went_back_is_read_again_from_its_new_end(
    kafka_cluster, unique_name, caplog, tmp_path, deferring
):
    topic = unique_name("behind")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    _produce(kafka_cluster, topic, "old", 30)
    options = {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": topic}
    options |= {"startingOffsets": "earliest", **{f"kafka.{k}": v for k, v in COMPAT_CONFIG.items()}}
    if deferring:  # as the job runs it (streaming.sources.source)
        options["stateDir"] = str(tmp_path / "source")
    reader = KafkaStreamReader(options)
    try:
        loop = Loop(reader)
        assert loop.batch() == [b"old%d" % i for i in range(30)]
        # The reads' kept consumers (this process is the read tasks' worker here) would ask for
        # the deleted topic, and the brokers create a topic asked for (auto.create.topics.enable).
        close_kept_consumers()
        kafka_cluster.delete_topic(topic)
        kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
        _produce(kafka_cluster, topic, "lost", 10)  # before the reader sees the new end: lost
        read: list[bytes] = []
        with caplog.at_level(logging.INFO, logger="streaming.source_kafka"):
            # (the new partition's leader may answer the reader's first questions late: a late
            # partition keeps its last known end, and is not judged)
            deadline = time.monotonic() + GO_BACK_AFTER_S + 30
            while not _said(caplog, "telemetry_offsets_went_back") and time.monotonic() < deadline:
                read += loop.batch()
                time.sleep(0.2)
            _produce(kafka_cluster, topic, "new", 25)
            deadline = time.monotonic() + 30
            while len(read) < 25 and time.monotonic() < deadline:
                read += loop.batch()
                time.sleep(0.2)
            read += loop.batch()
        went_back = _said(caplog, "telemetry_offsets_went_back")
    finally:
        reader.stop()
        close_kept_consumers()
    assert len(went_back) == 1, went_back
    assert f"topic={topic} partition=0 reading_from=30 end=10 now_reading_from=10" in went_back[0]
    assert read == [b"new%d" % i for i in range(25)], "every record written after the job went back, once"
    assert loop.start == {topic: {"0": 35}}


class FakeMarks:
    """Planned watermark answers, in place of ``streaming.sources.watermarks.Watermarks``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.high = 0
        self.late: list[tuple[str, int]] = []

    def poll(self, wait_s: float | None = None) -> tuple[Offsets, Offsets]:
        return {self.topic: {"0": 0}}, {self.topic: {"0": self.high}}

    def close(self) -> None:
        pass


def _reader(tmp_path, marks: FakeMarks, deferring: bool = True) -> KafkaStreamReader:
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": marks.topic, "startingOffsets": "earliest"}
    if deferring:
        options["stateDir"] = str(tmp_path / "source")
    reader = KafkaStreamReader(options)
    reader._marks = marks  # type: ignore[assignment]
    return reader


def _ranges(reader: KafkaStreamReader, start: Offsets, end: Offsets) -> list[tuple[Any, ...]]:
    return [(r.topic, r.partition, r.start, r.end) for r in reader.partitions(start, end)]


@pytest.mark.parametrize("deferring", [True, False])
def test_an_end_behind_for_less_than_the_grace_is_waited_out(tmp_path, monkeypatch, deferring):
    monkeypatch.setattr(source_kafka, "GO_BACK_AFTER_S", 3600.0)
    marks = FakeMarks("t")
    reader = _reader(tmp_path, marks, deferring)
    start = reader.initialOffset()
    marks.high = 100
    end = reader.latestOffset()
    assert _ranges(reader, start, end) == [("t", 0, 0, 100)]
    marks.high = 97  # a new leader's high watermark, trailing
    assert reader.latestOffset() == {"t": {"0": 100}}, "the job's offsets do not go back within the grace"
    reader.commit(end)
    marks.high = 104  # its followers fetched: the end passes the job's position again
    later = reader.latestOffset()
    assert later == {"t": {"0": 104}}
    assert _ranges(reader, end, later) == [("t", 0, 100, 104)], "nothing read twice"


@pytest.mark.parametrize("deferring", [True, False])
def test_going_back_reads_from_the_lowest_end_seen_and_survives_spark_committing_late(tmp_path, monkeypatch, deferring):
    marks = FakeMarks("t")
    reader = _reader(tmp_path, marks, deferring)
    start = reader.initialOffset()
    marks.high = 100
    b1 = reader.latestOffset()
    _ranges(reader, start, b1)
    monkeypatch.setattr(source_kafka, "GO_BACK_AFTER_S", 3600.0)
    marks.high = 40  # cut back
    assert reader.latestOffset() == b1
    marks.high = 43  # written to since
    assert reader.latestOffset() == b1
    monkeypatch.setattr(source_kafka, "GO_BACK_AFTER_S", 0.0)
    marks.high = 45
    b2 = reader.latestOffset()
    assert b2 == {"t": {"0": 45}}
    reader.commit(b1)  # Spark commits the batch before only now: must not undo going back
    assert _ranges(reader, b1, b2) == [("t", 0, 40, 45)]
    marks.high = 50
    b3 = reader.latestOffset()
    assert b3 == {"t": {"0": 50}}
    reader.commit(b2)
    assert _ranges(reader, b2, b3) == [("t", 0, 45, 50)]


def test_what_an_earlier_batch_still_owed_is_not_read_from_the_new_log(tmp_path, monkeypatch):
    """A short read (its leader hung) left offsets 60..100 owed; then the log went back to 40:
    the owed range is gone with the old log, and the new one is read from 40, not from 60."""
    from streaming.sources.deferred import Deferred, plan_id

    marks = FakeMarks("t")
    reader = _reader(tmp_path, marks)
    start = reader.initialOffset()
    marks.high = 100
    b1 = reader.latestOffset()
    assert _ranges(reader, start, b1) == [("t", 0, 0, 100)]
    Deferred(str(tmp_path / "source")).decide(plan_id(start, b1), ("t", 0, 0, 100), 60)  # read short
    monkeypatch.setattr(source_kafka, "GO_BACK_AFTER_S", 0.0)
    marks.high = 42
    b2 = reader.latestOffset()
    reader.commit(b1)
    assert _ranges(reader, b1, b2) == [], "nothing new yet, and nothing owed"
    marks.high = 48
    b3 = reader.latestOffset()
    reader.commit(b2)
    assert _ranges(reader, b2, b3) == [("t", 0, 42, 48)]

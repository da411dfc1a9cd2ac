"""One read task of the Kafka source (``streaming.sources.range_read``): every read of a range in its
batch hands Spark the same records, however many times Spark reads it."""

from __future__ import annotations

import pytest

from streaming.sources.deferred import Deferred
from streaming.sources.range_read import KafkaRange, _Read


def _consumer_config(kafka_cluster):
    """The source's consumer settings for the test cluster, as the job builds them."""
    from localkafka import COMPAT_CONFIG
    from streaming.sources.source_kafka import consumer_config

    return consumer_config(
        {
            "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
            **{f"kafka.{k}": v for k, v in COMPAT_CONFIG.items()},
        }
    )


def _records(read: _Read, first: int, last: int) -> None:
    for off in range(first, last):
        read.add(off, None, b"v%d" % off, None)


def test_a_read_past_another_reads_decision_hands_spark_only_what_that_one_did(tmp_path):
    r = KafkaRange("t", 0, 0, 100, str(tmp_path), "batch")
    read = _Read(r, Deferred(str(tmp_path)))
    _records(read, 0, 40)
    first = read.take()  # 0..39 with Spark
    _records(read, 40, 70)
    Deferred(str(tmp_path)).decide("batch", r.key, 55)  # another read of the range stopped at 55
    read.check()
    assert (read.upto, read.nxt) == (55, 55)
    assert first.column("offset").to_pylist() + read.take().column("offset").to_pylist() == list(range(55))


def test_a_read_that_already_handed_spark_more_than_another_decided_fails_its_task(tmp_path):
    """Spark's retry of the task then reads as far as the decision (the test below)."""
    r = KafkaRange("t", 0, 0, 100, str(tmp_path), "batch")
    read = _Read(r, Deferred(str(tmp_path)))
    _records(read, 0, 40)
    read.take()
    Deferred(str(tmp_path)).decide("batch", r.key, 30)
    with pytest.raises(RuntimeError, match="stopped at 30"):
        read.check()


def test_a_read_behind_another_reads_decision_reads_on_to_it(tmp_path):
    """Its leader stopped answering after 5 records, but another read of the range got to 60
    and decided first: this read must not stop short, it reads on to 60."""
    r = KafkaRange("t", 0, 0, 100, str(tmp_path), "batch")
    read = _Read(r, Deferred(str(tmp_path)))
    _records(read, 0, 5)
    Deferred(str(tmp_path)).decide("batch", r.key, 60)
    read.decide(5)
    assert (read.decided, read.upto, read.nxt) == (True, 60, 5)
    assert _Read(r, Deferred(str(tmp_path))).upto == 60  # and a read after both, the same


def test_big_records_are_handed_to_spark_in_batches_of_bounded_bytes(tmp_path):
    """Records of 1 MB fill an Arrow batch at ``_ARROW_BYTES``, not at ``_ARROW_ROWS`` records
    (4,096 of them were one 4 GB batch: the JVM ran out of memory); small ones at the count."""
    from streaming.sources.range_read import _ARROW_BYTES, _ARROW_ROWS

    read = _Read(KafkaRange("t", 0, 0, 10_000, None, None), None)
    big = b"x" * 1_000_000
    off = 0
    while not read.full:
        read.add(off, b"k", big, None)
        off += 1
    assert off == -(-_ARROW_BYTES // (len(big) + 1)) < _ARROW_ROWS
    assert read.take().num_rows == off and read.bytes == 0 and not read.full
    for i in range(_ARROW_ROWS - 1):
        read.add(off + i, None, b"small", None)
    assert not read.full
    read.add(off + _ARROW_ROWS, None, b"small", None)
    assert read.full and read.take().num_rows == _ARROW_ROWS


@pytest.mark.kafka
def test_every_read_of_a_range_in_its_batch_gets_what_the_first_got_on_real_kafka(kafka_cluster, unique_name, tmp_path):
    """The first read finds 30 of the range's 40 records (its leader answers no more: here the
    records are not there yet) and stops short at 30 after 3 s; 10 more arrive; a second read of
    the same range in the same batch (two executors computing one partition, a lost executor's
    partition) hands Spark the same 30, not 40; the next batch's read of the rest gets 30..39.
    Before every read decided the same, the second read got 40 and the next batch read 30..39
    again: one telemetry record counted twice (tests/e2e/test_spark_cluster.py)."""
    from confluent_kafka import Producer

    from streaming.sources.range_read import close_kept_consumers, read_range

    topic = unique_name("ranges")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = Producer(kafka_cluster.client_config(acks="all"))

    def produce(first: int, last: int) -> None:
        for i in range(first, last):
            producer.produce(topic, value=b"v%d" % i, partition=0)
        assert producer.flush(30) == 0

    def offsets(r: KafkaRange) -> list[int]:
        return [o for batch in read_range(config, r) for o in batch.column("offset").to_pylist()]

    config = _consumer_config(kafka_cluster)
    state = str(tmp_path)
    try:
        produce(0, 30)
        assert offsets(KafkaRange(topic, 0, 0, 40, state, "batch-1")) == list(range(30))
        assert Deferred(state).decided("batch-1", (topic, 0, 0, 40)) == 30
        produce(30, 40)
        assert offsets(KafkaRange(topic, 0, 0, 40, state, "batch-1")) == list(range(30))
        assert offsets(KafkaRange(topic, 0, 30, 40, state, "batch-2")) == list(range(30, 40))
        assert Deferred(state).decided("batch-2", (topic, 0, 30, 40)) == 40
        assert offsets(KafkaRange(topic, 0, 0, 40)) == list(range(40))  # no state directory: whole
    finally:
        close_kept_consumers()


@pytest.mark.kafka
def test_a_range_of_big_records_reaches_spark_in_batches_of_bounded_bytes_on_real_kafka(kafka_cluster, unique_name):
    """100 records of 900,000 bytes (a producer writing big records, bad ones, to the telemetry
    topic): every record read once, in order, in Arrow batches of at most ``_ARROW_BYTES`` and one
    record. Before, such records came in batches of 4,096: 1,200 of them on two partitions ran the
    job's JVM out of memory at every start (docs/benchmarks.md, "A flood of big records")."""
    from confluent_kafka import Producer

    from streaming.sources.range_read import _ARROW_BYTES, close_kept_consumers, read_range

    topic = unique_name("big-records")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = Producer(kafka_cluster.client_config(acks="all"))
    size, count = 900_000, 100
    for i in range(count):
        producer.produce(topic, value=bytes([i]) * size, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    config = _consumer_config(kafka_cluster)
    try:
        batches = list(read_range(config, KafkaRange(topic, 0, 0, count)))
    finally:
        close_kept_consumers()
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(count))
    assert [v[0] for b in batches for v in b.column("value").to_pylist()] == list(range(count))
    assert len(batches) > 1
    for b in batches:
        assert sum(len(v) for v in b.column("value").to_pylist()) < _ARROW_BYTES + size

"""One read task of the Kafka source (``streaming.sources.range_read``): every read of a range in its
batch hands Spark the same records, however many times Spark reads it."""

from __future__ import annotations

import pytest

from streaming.sources.deferred import Deferred
from streaming.sources.range_read import KafkaRange, _Read


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


@pytest.mark.kafka
def test_every_read_of_a_range_in_its_batch_gets_what_the_first_got_on_real_kafka(kafka_cluster, unique_name, tmp_path):
    """The first read finds 30 of the range's 40 records (its leader answers no more: here the
    records are not there yet) and stops short at 30 after 3 s; 10 more arrive; a second read of
    the same range in the same batch (two executors computing one partition, a lost executor's
    partition) hands Spark the same 30, not 40; the next batch's read of the rest gets 30..39.
    Before every read decided the same, the second read got 40 and the next batch read 30..39
    again: one telemetry record counted twice (tests/e2e/test_spark_cluster.py)."""
    from confluent_kafka import Producer

    from localkafka import COMPAT_CONFIG
    from streaming.sources.range_read import close_kept_consumers, read_range
    from streaming.sources.source_kafka import consumer_config

    topic = unique_name("ranges")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = Producer(kafka_cluster.client_config(acks="all"))

    def produce(first: int, last: int) -> None:
        for i in range(first, last):
            producer.produce(topic, value=b"v%d" % i, partition=0)
        assert producer.flush(30) == 0

    def offsets(r: KafkaRange) -> list[int]:
        return [o for batch in read_range(config, r) for o in batch.column("offset").to_pylist()]

    config = consumer_config(
        {
            "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
            **{f"kafka.{k}": v for k, v in COMPAT_CONFIG.items()},
        }
    )
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

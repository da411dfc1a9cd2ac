"""The isrwatch-kafka source with real Spark (local mode) and the real local Kafka cluster."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from localkafka import COMPAT_CONFIG

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module", autouse=True)
def _registered(spark):
    """The session's Spark (tests/streaming/conftest.py) with the isrwatch-kafka source."""

    from streaming.sources import source_kafka

    source_kafka.register(spark)


def produce(cluster, topic, first, last, partitions):
    p = Producer(cluster.client_config(acks="all"))
    for i in range(first, last):
        p.produce(topic, key=str(i).encode(), value=b"value-%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def stream(spark, cluster, topic, starting, cap=None, state_dir=None):
    """The source over ``topic``; ``state_dir``: its stateDir option, as the job sets it (``streaming.sources.source``)."""
    reader = (
        spark.readStream.format("isrwatch-kafka")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
    )
    for k, v in COMPAT_CONFIG.items():
        reader = reader.option(f"kafka.{k}", v)
    if cap:
        reader = reader.option("maxOffsetsPerTrigger", str(cap))
    if state_dir:
        reader = reader.option("stateDir", state_dir)
    return reader.load()


def wait_for(condition, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the streaming query did not get there"
        time.sleep(0.5)


def test_restart_on_the_same_checkpoint_reads_every_record_exactly_once_within_the_cap(
    spark, kafka_cluster, unique_name, tmp_path
):
    # 4000 records at most 250 a batch, a batch every 0.5 s: at least 8 s to read them all,
    # while the first run is stopped once it has read two batches (polled every 0.5 s).
    # (1000 records once let the first run finish before it was stopped.)
    topic, cap, first_n, total = unique_name("tel"), 250, 4000, 4400
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1)
    produce(kafka_cluster, topic, 0, first_n, 2)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start():
        return (
            stream(spark, kafka_cluster, topic, "earliest", cap)
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="0.5 seconds")
            .start()
        )

    def rows_in_batches(q):
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0]

    q = start()
    try:
        wait_for(lambda: len(rows_in_batches(q)) >= 2)
    finally:
        q.stop()
    first = rows_in_batches(q)
    assert 0 < sum(first) < first_n, "the first run should stop part way"
    produce(kafka_cluster, topic, first_n, total, 2)

    q = start()
    try:
        wait_for(lambda: spark.read.parquet(out).count() >= total)
        time.sleep(2)  # a wrongly re-read range would land now
    finally:
        q.stop()
    for batch in first + rows_in_batches(q):
        assert batch <= cap
    df = spark.read.parquet(out)
    rows = df.select("key", "value", "topic", "partition", "offset").collect()
    assert len(rows) == total
    assert sorted(int(r.key) for r in rows) == list(range(total))
    assert {(r.partition, r.offset) for r in rows} == {(p, o) for p in (0, 1) for o in range(total // 2)}
    assert all(r.value == b"value-%d" % int(r.key) and r.topic == topic for r in rows)
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "binary", "binary", "string", "int", "bigint", "timestamp",
    ]  # fmt: skip


def test_latest_starts_after_what_is_already_there(spark, kafka_cluster, unique_name):
    topic = unique_name("tel")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    produce(kafka_cluster, topic, 0, 50, 1)
    name = topic.replace("-", "_").replace(".", "_")
    q = stream(spark, kafka_cluster, topic, "latest").writeStream.format("memory").queryName(name).start()
    try:
        wait_for(lambda: q.lastProgress is not None)
        produce(kafka_cluster, topic, 50, 80, 1)
        wait_for(lambda: spark.table(name).count() >= 30)
        time.sleep(1)
        keys = sorted(int(r.key) for r in spark.table(name).collect())
    finally:
        q.stop()
    assert keys == list(range(50, 80))


# make campaign (~35 s): make test keeps the source's reader going back to a partition's new,
# lower end on real Kafka (tests/streaming/test_source_kafka_behind.py, with and without the stateDir).
@pytest.mark.campaign
def test_a_topic_created_again_is_read_again_while_running_and_after_a_restart(
    spark, kafka_cluster, unique_name, tmp_path
):
    """The telemetry topic deleted and created again under the query (its partitions' ends go
    back below the checkpoint's offsets): the query reads what is written there from the time
    it sees the new ends, running and after a restart on the same checkpoint
    (``streaming.sources.source_kafka``'s going back; tests/streaming/test_source_kafka_behind.py has the
    reader alone). The source's stateDir as the job sets it (``streaming.sources.source``)."""
    topic = unique_name("again")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def values() -> set[bytes]:
        try:
            return {r.value for r in spark.read.parquet(out).select("value").collect()}
        except Exception:  # no file written yet
            return set()

    def start():
        return (
            stream(spark, kafka_cluster, topic, "earliest", state_dir=f"{checkpoint}-source")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="0.5 seconds")
            .start()
        )

    def created_again(first: int) -> None:
        """Delete the topic, create it again, and write ``first`` records to it, before the query
        can see its new end: the source does not read those (values 0.., as the old log's)."""
        kafka_cluster.delete_topic(topic)
        # (the running query's source asking for it may have created it again already)
        kafka_cluster.create_topic(topic, partitions=1, replication_factor=1, exist_ok=True)
        produce(kafka_cluster, topic, 0, first, 1)

    def written_after(base: int, n: int) -> set[bytes]:
        """``n`` records written once the source has seen the new end (its metadata refresh and
        grace, GO_BACK_AFTER_S: 10 s each at most, so 12 s is after the first): their values."""
        time.sleep(12)
        produce(kafka_cluster, topic, base, base + n, 1)
        return {b"value-%d" % i for i in range(base, base + n)}

    produce(kafka_cluster, topic, 0, 30, 1)
    q = start()
    try:
        wait_for(lambda: len(values()) >= 30)
        created_again(5)
        running = written_after(1000, 20)  # the new end, 25, below the query's 30
        wait_for(lambda: running <= values(), timeout_s=90)
    finally:
        q.stop()
    created_again(5)
    q = start()
    try:
        restarted = written_after(2000, 10)  # 15, below the checkpoint's 25
        wait_for(lambda: restarted <= values(), timeout_s=90)
    finally:
        q.stop()

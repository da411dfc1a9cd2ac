"""The state topic written by the executors (``streaming.sinks.statewriter``): records made in the
JVM read back as the statuses the driver computes, real Kafka receives them from Spark's
Python workers, and what a task cannot deliver in time goes through the driver, in order."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator

import pytest

from isrwatch.status import STATUS_FIELDS, ReplicaStatus, State, status_from_record, status_key, status_to_json
from localkafka.cluster import COMPAT_CONFIG
from localkafka.ports import free_port
from streaming.sinks.outputs import KafkaStates, make_producer, producer_config
from streaming.sinks.producer import OutputProducer
from streaming.sinks.statewriter import StateWriter, state_records
from tests.e2e.kafka_io import read_records


def _status(broker: int, state: State = State.OK, **kw: object) -> ReplicaStatus:
    values: dict[str, object] = dict(
        cluster="c", topic="orders", partition=3, broker_id=broker, leader_id=1, eval_ms=1_700_000_000_123,
        state=state, time_since_caught_up_s=12.25, lag_ratio=0.4083, time_to_shrink_s=17.75,
        offset_lag=1_234_567_890_123, in_isr=True, isr_size=3, min_isr=None, lag_time_max_ms=30_000,
        shrink_window_start_ms=1_700_000_017_873, shrink_window_end_ms=1_700_000_022_873,
        lag_state=state, peak_lag_ratio=None, out_of_sync_episodes=2,
    )  # fmt: skip
    values.update(kw)
    return ReplicaStatus(**values)  # type: ignore[arg-type]


STATUSES = [
    _status(2),
    _status(3, State.STALLED, lag_state=State.NEARING, lag_ratio=1e-7, peak_lag_ratio=2.5e6, min_isr=2),
    _status(4, State.OUT_OF_SYNC, in_isr=False, isr_size=2, time_since_caught_up_s=0.0, lag_ratio=1.0),
]


def _rows(spark, statuses: list[ReplicaStatus], last_t_ms: int = 1_700_000_000_123):  # type: ignore[no-untyped-def]
    """The statuses as ``evaluate.status_columns`` gives them (states as their values)."""
    rows = []
    for s in statuses:
        d = status_to_json(s)
        rows.append({**{f: d[f] for f in STATUS_FIELDS}, "last_t_ms": last_t_ms, "observations": 7})
    schema = (
        "cluster string, topic string, partition int, broker_id int, leader_id int, eval_ms long, state string, "
        "time_since_caught_up_s double, lag_ratio double, time_to_shrink_s double, offset_lag long, in_isr boolean, "
        "isr_size int, min_isr int, lag_time_max_ms long, shrink_window_start_ms long, shrink_window_end_ms long, "
        "lag_state string, peak_lag_ratio double, out_of_sync_episodes long, last_t_ms long, observations long"
    )
    return spark.createDataFrame([tuple(r.values()) for r in rows], schema)


def test_records_made_in_the_jvm_read_back_as_the_statuses(spark) -> None:
    """Key, field names, types and values as the driver's ``status_to_json`` writes them; the
    exporter's own reader (``status_from_record``) gives back the status."""
    got = {r.key.decode(): r.value for r in state_records(_rows(spark, STATUSES)).collect()}
    assert set(got) == {status_key(s) for s in STATUSES}
    for s in STATUSES:
        value = bytes(got[status_key(s)])
        assert json.loads(value) == status_to_json(s)
        assert status_from_record(value) == s


def test_a_replica_the_driver_forgot_in_the_batch_gets_no_record(spark) -> None:
    """Said gone (or elected leader, or late) at or after its newest telemetry: no record, the
    tombstone is the last word; said gone before it: observed after, its record goes."""
    rows = _rows(spark, STATUSES, last_t_ms=100_000)
    gone = [("c", "orders", 3, 2, 100_000), ("c", "orders", 3, 3, 99_999), ("c", "other", 3, 4, 200_000)]
    keys = {r.key.decode() for r in state_records(rows, gone).collect()}
    assert keys == {"c/orders/3/3", "c/orders/3/4"}


def test_spark_s_python_workers_write_the_records_to_kafka(spark, kafka_cluster, unique_name) -> None:
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=3, config={"cleanup.policy": "compact"})
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]  # Kafka 0.9: no ApiVersions request
    conf = producer_config(kafka_cluster.bootstrap_servers, flags)
    driver = OutputProducer(make_producer(kafka_cluster.bootstrap_servers, flags), latest_wins={topic})
    # Who writes, not how soon: a topic this new answers its first acks=all produce late (its
    # followers' fetchers starting: up to 0.36 s measured on an idle machine, more under a loaded
    # CI's), and a task hearing nothing for FLUSH_S (1 s) hands its records to the driver, as
    # it should. The tests below take that path on purpose.
    writer = StateWriter(conf, topic, driver, flush_s=30.0)
    assert writer.write(state_records(_rows(spark, STATUSES))) == ("executors", len(STATUSES))
    assert writer.writers and all(pid != os.getpid() for _, pid in writer.writers)  # not the driver
    assert sum(writer.writers.values()) == len(STATUSES)
    records = read_records(kafka_cluster, topic)
    assert {k.decode(): status_from_record(v) for _, _, k, v in records} == {status_key(s): s for s in STATUSES}
    assert len(driver) == 0


@pytest.fixture
def nowhere() -> Iterator[tuple[str, OutputProducer]]:
    """A state topic on a loopback address nothing listens at, and the driver's producer for it
    (its records purged at the end)."""
    address = f"127.0.0.1:{free_port()}"
    driver = OutputProducer(make_producer(address, ["message.timeout.ms=60000"]), latest_wins={"state"})
    yield address, driver
    driver.producer.purge()
    driver.producer.flush(0)


def test_records_not_acknowledged_in_time_go_through_the_driver_and_so_do_the_next(spark, nowhere) -> None:
    """A state topic whose leader does not answer (here: nothing listens at the address): each
    task waits ``flush_s``, then hands its records to the driver, which holds them (newest of a
    key wins) without blocking; while it holds any, the next batch goes through the driver,
    so nothing newer overtakes them."""
    address, driver = nowhere
    writer = StateWriter(producer_config(address, []), "state", driver, flush_s=1.0)
    assert writer.write(state_records(_rows(spark, STATUSES))) == ("executors", len(STATUSES))
    assert writer.writers is not None and sum(writer.writers.values()) == 0  # none delivered by the executors
    assert driver.stats()["state"].pending == len(STATUSES)
    assert writer.write(state_records(_rows(spark, STATUSES[:1]))) == ("driver", 1)
    assert driver.stats()["state"].pending == len(STATUSES) + 1  # behind the older, in order


def test_a_batch_the_executors_cannot_write_is_written_by_the_driver(spark, nowhere) -> None:
    """A task that fails (here: a producer setting librdkafka refuses, raised in the Python
    worker) fails the write, not the batch: the driver writes that batch's records."""
    address, driver = nowhere
    writer = StateWriter({**producer_config(address, []), "no.such.setting": "1"}, "state", driver)
    assert writer.write(state_records(_rows(spark, STATUSES))) == ("driver", len(STATUSES))
    assert writer.executors_failed is None  # not an import error: the executors are tried again
    assert driver.stats()["state"].pending == len(STATUSES)


def test_state_writer_driver_keeps_the_executors_out(spark, nowhere) -> None:
    """``--state-writer driver``: the driver produces every record, the executors none."""
    address, driver = nowhere
    writer = StateWriter(producer_config(address, []), "state", driver, by_driver=True)
    assert writer.write(state_records(_rows(spark, STATUSES))) == ("driver", len(STATUSES))
    assert writer.writers is None and driver.stats()["state"].pending == len(STATUSES)


def test_a_handed_back_record_landing_late_is_overwritten_by_the_newest(spark, kafka_cluster_factory) -> None:
    """The state topic's leader hangs while the executors write: their records go back to the
    driver, which also writes the next batch's newer ones and a tombstone. A handed-back record
    may still land when the leader wakes, after the driver's newer one (made certain here by
    sending it late ourselves): once the driver's records are acknowledged, and
    ``repair_after_s`` later, the driver sends each such replica's newest record once more, so
    the last record of every key is its newest (the tombstone for the forgotten one). One
    broker: the test pauses the only leader the topic has."""
    cluster = kafka_cluster_factory(brokers=1)
    topic = "state"
    cluster.create_topic(topic, partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]
    driver = OutputProducer(make_producer(cluster.bootstrap_servers, flags), latest_wins={topic})
    writer = StateWriter(producer_config(cluster.bootstrap_servers, flags), topic, driver, repair_after_s=0.5)
    tombstones = KafkaStates(driver, topic, writer.forgotten)
    newer = [dataclasses.replace(s, eval_ms=s.eval_ms + 1_000) for s in STATUSES[:2]]
    cluster.pause(1)
    try:
        assert writer.write(state_records(_rows(spark, STATUSES))) == ("executors", len(STATUSES))
        assert writer.writers is not None and sum(writer.writers.values()) == 0  # all handed back
        assert writer.write(state_records(_rows(spark, newer))) == ("driver", len(newer))
        tombstones.remove([status_key(STATUSES[2])])
    finally:
        cluster.resume(1)
    deadline = time.monotonic() + 60
    while driver.stats()[topic].pending and time.monotonic() < deadline:
        driver.poll(0.2)
    assert not driver.stats()[topic].pending, "the driver's records acknowledged once the leader woke"
    late = make_producer(cluster.bootstrap_servers, flags)
    for s in STATUSES:  # the executors' records, landing after the driver's
        late.produce(topic, key=status_key(s).encode(), value=json.dumps(status_to_json(s)).encode())
    assert late.flush(30) == 0
    empty = state_records(_rows(spark, []))
    assert writer.write(empty) == ("driver", 0)  # settled from now on: the clock starts
    time.sleep(0.6)
    assert writer.write(empty) == ("driver", 0)  # repaired before this batch's (no) records
    assert driver.flush(30) == 0
    last = {k.decode(): v for _, _, k, v in read_records(cluster, topic)}
    assert set(last) == {status_key(s) for s in STATUSES}
    assert {k: status_from_record(v) for k, v in last.items() if v is not None} == {status_key(s): s for s in newer}
    assert last[status_key(STATUSES[2])] is None, "the forgotten replica's tombstone is its last record"
    assert writer.write(state_records(_rows(spark, newer)))[0] == "executors", "back to the executors"


def test_every_record_a_task_purges_comes_back_however_late_its_report(spark, kafka_cluster_factory) -> None:
    """A task purges what its hung leader has not acknowledged in ``flush_s``; librdkafka may
    report purged records a moment after the purge (seen: none at once, all 0.2-0.5 s later). The
    task waits for those reports, so each of a batch's records is acknowledged or handed back,
    batch after batch of the pause: none is neither. (Before, with two tasks of 20 records
    each, none of the first batch's came back and about half of each later one's: neither
    acknowledged nor handed back. The worker's producer still delivered them when the leader
    woke, but the driver, told of none, did not hold them, so every later batch of the fault
    waited on the hung leader again; and had the leader not come back before the producer's
    message timeout, their failure would have been reported to no one.) One broker: the test
    pauses the only leader the topic has."""
    from streaming.sinks.statewriter import RECORD_SCHEMA, produce_partition

    cluster = kafka_cluster_factory(brokers=1)
    topic = "state"
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]
    n = 40
    records = spark.range(n).selectExpr("binary(string(id)) AS key", "binary(repeat('x', 300)) AS value").repartition(2)
    run = produce_partition(producer_config(cluster.bootstrap_servers, flags), topic, 1.0)
    assert records.mapInArrow(run, RECORD_SCHEMA).where("kind = 'task'").groupBy().sum("sent").first()[0] == n
    cluster.pause(1)
    try:
        for batch in range(3):
            back = records.mapInArrow(run, RECORD_SCHEMA).toArrow().to_pylist()
            sent = sum(r["sent"] for r in back if r["kind"] == "task")
            failed = {r["key"] for r in back if r["kind"] == "failed"}
            assert sent + len(failed) == n, (batch, sent, len(failed))
            assert [r["error"] for r in back if r["kind"] == "task"] == [None, None], batch  # every report came
    finally:
        cluster.resume(1)


def test_a_partition_longer_to_produce_than_flush_s_is_delivered_by_the_executors(
    spark, kafka_cluster, unique_name
) -> None:
    """``flush_s`` is a time without acknowledgements, not a deadline from the task's start: a
    task whose records take longer than it to produce still delivers them all while its
    leaders answer. (With a deadline, make bench-fleet's 1M run handed most of a batch's
    records back to the driver, whose JVM ran out of heap taking them: docs/benchmarks.md.)"""
    from pyspark.sql import functions as F

    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1)
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]
    driver = OutputProducer(make_producer(kafka_cluster.bootstrap_servers, flags), latest_wins={topic})
    n = 60_000  # a replica per broker id, two tasks of 30,000 records
    one = _rows(spark, [_status(0)]).drop("broker_id")
    rows = spark.range(n).select(F.col("id").cast("int").alias("broker_id")).crossJoin(one).repartition(2)
    # A queue of 1,000 records: a task produces its 30,000 as the acknowledgements free room,
    # ~30 rounds of the producer's 50 ms linger, longer than flush_s; acknowledgements come
    # every round, well within it.
    conf = producer_config(kafka_cluster.bootstrap_servers, [*flags, "queue.buffering.max.messages=1000"])
    writer = StateWriter(conf, topic, driver, flush_s=0.5)
    assert writer.write(state_records(rows)) == ("executors", n)
    assert writer.writers is not None and sum(writer.writers.values()) == n
    assert len(driver) == 0
